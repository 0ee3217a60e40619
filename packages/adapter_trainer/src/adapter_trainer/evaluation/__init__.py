"""The evaluation room: how a run is measured (pure measurement: no training step, no model construction).

The learning-check math on code targets (`learning_check`: unigram baseline, caption derangements, bootstrap
intervals, the report) and the attribute probe that asks whether generated codes follow their captions (`probe`)."""

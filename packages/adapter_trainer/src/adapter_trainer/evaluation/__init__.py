"""The evaluation room: how a run is measured (pure measurement: no training step, no model construction).

The learning check on code targets (`stats`: unigram baseline, caption derangements, bootstrap intervals;
`target_ce`: summed CE per codebook, clip and frame; `held_out`: the scoring; `report`; `learning_check`: its
verdicts, as JSON and text) and the attribute probe that asks whether generated codes follow their captions
(`probe`)."""

"""The training room: the recipe (setup / train / cleanup) and the library it is a leaf over.

The recipe (`recipe`, torchtune style) stands on: devices and precision (`device`), the accumulation step (`step`),
AdamW groups and the LR schedule (`optim`), checkpoints and the run fingerprint (`checkpoint`), resuming a run in
place (`resume`), the example spec, order and loader built from the config (`data_setup`), torchrun collectives
(`distributed`), metric loggers (`metric_logging`), the figures a model reports of its weights (`model_figures`),
the loss-curve plot (`plots`) and the end-of-run report (`final_report`). Nothing outside this room imports `recipe`.
"""

"""The training room: the recipe (`recipe`, torchtune style: setup / train / cleanup) and the library it is a
leaf over: devices and precision (`device`), the accumulation step (`step`), AdamW groups and the LR schedule
(`optim`), checkpoints and the run fingerprint (`checkpoint`), torchrun collectives (`distributed`), metric
loggers (`metric_logging`) and the loss-curve plot (`plots`). Nothing outside this room imports `recipe`."""

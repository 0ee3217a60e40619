"""The demo room: the embedded offline default (real runs never need this room).

Tiny Llama / MusicGen checkpoints (`models`), their pretraining (`pretrain`, `music_pretrain`) and the listening page."""

"""The demo room: the embedded offline default (real runs never need this room).

Tiny Llama / MusicGen checkpoints with the real architectures (`models`), the tiny Llama's caption pretraining
(`pretrain`), and the listening page (`listen_page`, rendered to a PNG by `listen_check`)."""

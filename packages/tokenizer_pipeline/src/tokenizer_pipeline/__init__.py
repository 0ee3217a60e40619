"""tokenizer_pipeline: MusicCaps CSV (or any audio + captions) -> EnCodec codes in versioned WebDataset shards.

Flat on purpose: the modules follow the stage's steps (docs/architecture.md lists each one).
    musiccaps.py -> read_audio.py -> encode.py -> write_shards.py + manifest.py -> verify.py
    run.py orchestrates them (workers, resume, torchrun ranks); cli.py is the Hydra entry point.
    download.py + ffmpeg_binary.py fetch audio windows; decode.py turns codes back into audio in its own process;
    standin_corpus.py + demo_codec.py build the embedded offline default; errors.py is the user-error base (exit 2).

It never imports adapter_trainer: the shard format (docs/shard-format.md) is the whole interface.
"""

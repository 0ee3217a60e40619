"""tokenizer_pipeline: MusicCaps CSV (or any audio + captions) -> EnCodec codes in versioned WebDataset shards.

Rooms, one concern each (docs/architecture.md lists every module; tests/test_architecture.py checks the imports):
    sources/   what to encode: MusicCaps CSV rows, or your own tracks cut into planned segments (key, split, window)
    audio/     audio files in: probe a header, decode a window to float32 mono at the codec's rate
    codec/     the codec: load EnCodec and name it; audio -> codes, codes -> audio (decode), encoder latents
    shards/    the shard-set contract: naming rule, sample and manifest records, the tar writer, verify
    run/       one run on 1 or N ranks: plan shards, redo what changed, decode workers, encode loop, manifest
    fetch/     `make audio`: each MusicCaps row's window from YouTube, cut sample-exact to flac
    demo/      the embedded offline default: the stand-in corpus and the demo codec
Imports go one way: shards <- audio <- {sources, codec} <- run; fetch uses sources/audio/shards; demo only audio.
The top level holds the bottom every room may use (errors, config, conf_dir, dir_lock), the Hydra entry point
(`cli`, `__main__`), and the command modules that only forward to a room (`download`, `decode`, `verify`,
`codec_embeddings`, `standin_corpus`, `demo_codec`), so `python -m tokenizer_pipeline.<command>` stays short.

It never imports adapter_trainer: the shard format (docs/shard-format.md) is the whole interface.
"""

"""tokenizer_pipeline: MusicCaps CSV (or any audio + captions) -> EnCodec codes in versioned WebDataset shards.

It never imports adapter_trainer: the shard format (docs/shard-format.md) is the whole interface; docs/architecture.md
describes its rooms.
"""

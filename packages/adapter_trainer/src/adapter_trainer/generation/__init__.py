"""The generation room: codes sampled from a trained adapter, written as a contract shard set.

`python -m adapter_trainer.generate` (`generate`, schema in `config`; a run's checkpoint or an exported adapter folder:
`model_source`), KV-cached sampling with classifier-free guidance
(`sampling`) and generated codes written as a contract shard set (`generated_shards`), which
`tokenizer_pipeline.decode` turns into audio in its own process."""

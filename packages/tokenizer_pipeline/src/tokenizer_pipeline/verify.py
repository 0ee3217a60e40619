"""`python -m tokenizer_pipeline.verify <shard-set>`: check a shard set against docs/shard-format.md.

A command module only: the code lives in `tokenizer_pipeline.shards.verify`.
"""

from tokenizer_pipeline.shards.verify import main

if __name__ == "__main__":
    raise SystemExit(main())

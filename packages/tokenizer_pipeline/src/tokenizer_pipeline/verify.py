"""`python -m tokenizer_pipeline.verify <shard-set>`: check a shard set against docs/shard-format.md.

A command module only: the code lives in `tokenizer_pipeline.shards.verify`; `tokenizer_pipeline.remote.fetch`
adds the reading of a set at a URL.
"""

from tokenizer_pipeline.remote.fetch import main

if __name__ == "__main__":
    raise SystemExit(main())

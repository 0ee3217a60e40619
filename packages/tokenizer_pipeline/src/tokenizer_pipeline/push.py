"""`python -m tokenizer_pipeline.push <shard-set> <url>`: copy a shard set to a directory, s3://, gs:// or hf://.

A command module only: the code lives in `tokenizer_pipeline.remote.push`.
"""

from tokenizer_pipeline.remote.push import main

if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m tokenizer_pipeline.decode <shard-set> out_dir=DIR [...]`: codes -> wav files with the codec that made them.

A command module only: the code lives in `tokenizer_pipeline.codec.decode`.
"""

from tokenizer_pipeline.codec.decode import main

if __name__ == "__main__":
    raise SystemExit(main())

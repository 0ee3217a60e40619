"""`python -m tokenizer_pipeline.demo_codec --corpus DIR --out DIR`: the offline demo codec.

A command module only: the code lives in `tokenizer_pipeline.demo.demo_codec`.
"""

from tokenizer_pipeline.demo.demo_codec import main

if __name__ == "__main__":
    raise SystemExit(main())

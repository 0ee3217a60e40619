"""`python -m tokenizer_pipeline.standin_corpus --csv CSV --out DIR`: the offline stand-in corpus.

A command module only: the code lives in `tokenizer_pipeline.demo.standin_corpus`.
"""

from tokenizer_pipeline.demo.standin_corpus import main

if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m tokenizer_pipeline.download out_dir=DIR [hydra overrides]`: MusicCaps CSV -> `<out_dir>/<ytid>.flac`.

A command module only: the code lives in `tokenizer_pipeline.fetch.download`.
"""

from tokenizer_pipeline.fetch.download import main

if __name__ == "__main__":
    raise SystemExit(main())

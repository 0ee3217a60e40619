"""`python -m tokenizer_pipeline [--explain] [hydra overrides]`."""

from .cli import main

if __name__ == "__main__":
    main()

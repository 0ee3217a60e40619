"""`python -m adapter_trainer.generate`: sample codes from a trained adapter into a shard set. The code lives in `adapter_trainer.generation.generate`."""

from adapter_trainer.generation.generate import main

if __name__ == "__main__":
    main()

"""`python -m adapter_trainer.probe`: does generation follow the caption (attribute probe). The code lives in `adapter_trainer.evaluation.probe`."""

from adapter_trainer.evaluation.probe import main

if __name__ == "__main__":
    raise SystemExit(main())

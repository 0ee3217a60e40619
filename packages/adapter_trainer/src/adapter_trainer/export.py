"""`python -m adapter_trainer.export`: a run's checkpoint as a shareable adapter folder. The code lives in `adapter_trainer.sharing.export`."""

from adapter_trainer.sharing.export import main

if __name__ == "__main__":
    raise SystemExit(main())

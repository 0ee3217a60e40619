"""`python -m adapter_trainer.demo_models`: build the embedded tiny demo models. The code lives in `adapter_trainer.demo.models`."""

from adapter_trainer.demo.models import main

if __name__ == "__main__":
    main()

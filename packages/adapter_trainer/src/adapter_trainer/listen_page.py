"""`python -m adapter_trainer.listen_page`: write the static listening page of a run. The code lives in `adapter_trainer.demo.listen_page`."""

from adapter_trainer.demo.listen_page import main

if __name__ == "__main__":
    raise SystemExit(main())

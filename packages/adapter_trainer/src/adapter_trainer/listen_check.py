"""`python -m adapter_trainer.listen_check`: render the listening page to a PNG with headless Chromium. The code lives in `adapter_trainer.demo.listen_check`."""

from adapter_trainer.demo.listen_check import main

if __name__ == "__main__":
    raise SystemExit(main())

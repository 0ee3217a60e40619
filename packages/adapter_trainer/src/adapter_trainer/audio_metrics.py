"""`python -m adapter_trainer.audio_metrics`: CLAP score, FAD and classifier KL of decoded clips. The code lives in
`adapter_trainer.evaluation.audio_metrics`."""

from adapter_trainer.evaluation.audio_metrics import main

if __name__ == "__main__":
    raise SystemExit(main())

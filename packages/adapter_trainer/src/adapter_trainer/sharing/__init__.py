"""The sharing room: a trained adapter exported as a self-contained folder with a model card, pushed to the Hub.

`python -m adapter_trainer.export` (`export`: a run's checkpoint -> adapter.safetensors, adapter_config.json,
generation_config.json), its Hugging Face model card (`model_card`) and `--push-to-hub` (`hub`). The folder's format
and `load_adapter` live in `model.adapter_io`, which generation uses too."""

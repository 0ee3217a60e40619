"""Tests of adapter_trainer.sharing: export, the model card, the Hub push, and generation from an exported folder."""

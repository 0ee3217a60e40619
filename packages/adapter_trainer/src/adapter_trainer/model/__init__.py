"""The model room: what the adapter is, and the builders that assemble it around the frozen towers.

The MoT adapter (`mot`), its LoRA delta (`lora`) and the builders that load the frozen towers and assemble the adapter
(`builders`). Nothing here reads data or writes files."""

"""The model room: the MoT adapter (`mot`), its LoRA delta (`lora`) and the builders that load the frozen towers
and assemble the adapter (`builders`). Nothing here reads data or writes files."""

"""The model room: what the adapter is, and the builders that assemble it around the frozen towers.

The MoT adapter (`mot`), its LoRA delta (`lora`) and the builders that load the frozen towers and assemble the adapter
(`builders`), and `adapter_io`, which reads an exported adapter folder back (`load_adapter`). Nothing here reads shard
data or writes files."""

"""The model room: what the adapter is, and the builders that assemble it around the frozen towers.

The MoT adapter (`mot`) and, one concern each, its layer (`layers`: the modality-routed Llama layer, the audio
expert, CaptionCond), its attention call (`attention`, kernel rules in `sdpa_kernels`), its generation cache
(`kv_cache`) and its loss (`loss`); the `audio_tower=musicgen` adapter (`musicgen_rows`) and its generation state
(`musicgen_cache`); the LoRA delta (`lora`), the builders that load the frozen towers and assemble the
adapter (`builders`), and `adapter_io`, which reads an exported adapter folder back (`load_adapter`). Nothing here
reads shard data or writes files."""

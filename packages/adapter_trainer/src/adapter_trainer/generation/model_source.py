"""Where generation's model comes from: a run's checkpoint (`generate.run_source`) or an exported adapter folder
(`adapter_source`, `generate.adapter=DIR`, configured from the folder alone by `adapter_generate_config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from adapter_trainer.config import ConfigError, OptimizerConfig
from adapter_trainer.generation.config import GenerateConfig, GenerateRunConfig, validate_generate

# sections the folder decides (all but trainer.device); overriding them with generate.adapter is refused
ADAPTER_ONLY = ("data.", "model.", "optimizer.", "trainer.", "experiment")


@dataclass
class GenerationSource:
    """The model to sample from and what the generated set records about where it came from."""

    model: Any  # MoTAdapterModel, eval mode, adapter weights loaded
    tokenizer: Any  # the LLM's tokenizer
    vocab: Any  # AudioVocab
    bos_id: int
    pad_id: int
    frame_rate: float  # code frames per second of the codec
    source_manifest: dict[str, Any]  # codec, codes: what write_generated_set copies
    provenance: dict[str, Any]  # the generated manifest's checkpoint / source fields
    eval_clips: list = field(default_factory=list)  # captions=eval: the first n eval clips (run source only)


def adapter_generate_config(cfg: DictConfig, given: set[str] | None = None) -> GenerateRunConfig:
    """Composed `generate` config with generate.adapter=DIR -> GenerateRunConfig built from the folder. Sampling keys
    not in `given` (the command line's keys; None: all given) take generation_config.json's values."""
    from adapter_trainer.model.adapter_io import SAMPLING_KEYS, AdapterError, adapter_train_config, read_adapter_config

    g = OmegaConf.to_object(cfg.generate)
    assert isinstance(g, GenerateConfig), type(g)
    clash = sorted(k for k in given or () if k.startswith(ADAPTER_ONLY) and k != "trainer.device")
    if clash:
        raise ConfigError(
            f"generate.adapter={g.adapter} takes the model, data layout and precision from its "
            f"{Path(g.adapter) / 'adapter_config.json'}; drop {', '.join(clash)} (local copies of the base towers: "
            f"generate.adapter_llm=DIR generate.adapter_audio_lm=DIR; the device: trainer.device)"
        )
    folder = Path(g.adapter)  # type: ignore[arg-type]
    acfg = read_adapter_config(folder)
    if given is not None and (folder / "generation_config.json").is_file():
        from adapter_trainer.model.adapter_io import GENERATION_FILE, read_json

        defaults = read_json(folder / GENERATION_FILE, "sampling defaults")
        for key in SAMPLING_KEYS:
            if f"generate.{key}" not in given and key in defaults:
                setattr(g, key, type(getattr(g, key))(defaults[key]))
    if not g.out_dir:
        g.out_dir = str(Path("outputs") / folder.resolve().name / "generated")
    validate_generate(g)
    device = OmegaConf.select(cfg, "trainer.device", default="auto", throw_on_missing=False)
    try:
        train = adapter_train_config(acfg, llm=g.adapter_llm, audio_lm=g.adapter_audio_lm, device=str(device))
    except (KeyError, TypeError, ValueError) as e:
        raise AdapterError(f"{folder / 'adapter_config.json'}: {type(e).__name__} {e}; export the adapter again") from e
    return GenerateRunConfig(
        data=train.data, model=train.model, optimizer=OptimizerConfig(), trainer=train.trainer, generate=g
    )


def adapter_source(cfg: GenerateRunConfig, device: Any) -> GenerationSource:
    """Load the adapter folder of generate.adapter onto `device` (checks: `model.adapter_io.load_adapter`)."""
    from adapter_trainer.model.adapter_io import load_adapter

    g = cfg.generate
    folder = Path(g.adapter)  # type: ignore[arg-type]
    loaded = load_adapter(
        folder, llm=cfg.model.llm, audio_lm=cfg.model.audio_lm, device=device, check_weights=g.check_base_weights
    )
    acfg = loaded.adapter_config
    dropout = float(acfg["captions"]["caption_dropout"])
    if g.cfg_scale != 1.0 and not g.allow_untrained_uncond and dropout <= 0.0:
        raise ConfigError(
            f"generate.cfg_scale={g.cfg_scale} needs the empty caption, but {folder} was trained with "
            f"data.caption_dropout={dropout:g} (its unconditioned branch never trained); use generate.cfg_scale=1 "
            f"or pass generate.allow_untrained_uncond=true"
        )
    shards = acfg["shards"]
    return GenerationSource(
        model=loaded.model,
        tokenizer=loaded.tokenizer,
        vocab=loaded.vocab,
        bos_id=loaded.bos_id,
        pad_id=loaded.pad_id,
        frame_rate=float(acfg["codec"]["frame_rate"]),
        source_manifest={"codec": acfg["codec"], "codes": shards["codes"]},
        provenance={
            "adapter": str(folder),  # the codec's path_from_set is relative to it (generated_shards)
            "checkpoint": acfg["training"]["checkpoint"],
            "checkpoint_step": acfg["training"]["step"],
            "source_shards": [],
            "source_manifest_sha256": [s["manifest_sha256"] for s in shards["sets"]],
        },
    )

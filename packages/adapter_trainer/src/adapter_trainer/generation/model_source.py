"""Where generation's model comes from: a run's checkpoint (`generate.run_source`) or an exported adapter folder
(`api.MoTAdapter`; `generate.adapter=DIR` is configured from the folder alone by `adapter_generate_config`), a local
directory or a Hub repo (`adapter_folder`).
"""

from __future__ import annotations

import os
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
    device: Any  # torch.device the model is on
    pattern: str  # data.pattern the model was trained with (delay | flatten)
    precision: str  # trainer.precision: the autocast sampling runs under
    max_caption_tokens: int  # captions are cut to this many tokens, as training cut them
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
    folder = adapter_folder(g.adapter)  # type: ignore[arg-type]
    acfg = read_adapter_config(folder)
    if given is not None and (folder / "generation_config.json").is_file():
        from adapter_trainer.model.adapter_io import GENERATION_FILE, read_json

        defaults = read_json(folder / GENERATION_FILE, "sampling defaults")
        for key in SAMPLING_KEYS:
            if f"generate.{key}" not in given and key in defaults:
                setattr(g, key, type(getattr(g, key))(defaults[key]))
    if not g.out_dir:  # a Hub repo: its name, not its snapshot's commit
        name = folder.resolve().name if Path(g.adapter).expanduser().is_dir() else str(g.adapter).rsplit("/", 1)[-1]
        g.out_dir = str(Path("outputs") / name / "generated")
    g.adapter = str(folder)
    validate_generate(g)
    device = OmegaConf.select(cfg, "trainer.device", default="auto", throw_on_missing=False)
    try:
        train = adapter_train_config(acfg, llm=g.adapter_llm, audio_lm=g.adapter_audio_lm, device=str(device))
    except (KeyError, TypeError, ValueError) as e:
        raise AdapterError(f"{folder / 'adapter_config.json'}: {type(e).__name__} {e}; export the adapter again") from e
    return GenerateRunConfig(
        data=train.data, model=train.model, optimizer=OptimizerConfig(), trainer=train.trainer, generate=g
    )


def adapter_folder(name_or_path: str | os.PathLike, revision: str | None = None) -> Path:
    """An exported adapter folder: the directory itself, or the snapshot of a Hub repo that `--push-to-hub` wrote
    (downloaded, or read from the local cache when offline or when the Hub cannot serve it: `model.hub_source`)."""
    from adapter_trainer.model.adapter_io import AdapterError
    from adapter_trainer.model.builders import _looks_like_path

    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    fix = "export one with `python -m adapter_trainer.export RUN_DIR --out DIR`, or pass a Hub repo id (user/name)"
    if _looks_like_path(str(name_or_path)) or str(name_or_path).count("/") != 1:
        raise AdapterError(f"adapter folder {name_or_path} does not exist; {fix}")
    from huggingface_hub import snapshot_download

    from adapter_trainer.model.hub_source import cache_only

    try:
        local = cache_only(str(name_or_path))
        return Path(snapshot_download(str(name_or_path), revision=revision, local_files_only=local))
    except Exception as e:  # huggingface_hub's errors (HfHubHTTPError, HFValidationError, ...), ModelSourceError
        why = " ".join(str(e).split())[:300] or type(e).__name__
        raise AdapterError(
            f"adapter {str(name_or_path)!r}: no such folder, and the Hub repo is unreadable ({why}); {fix}"
        ) from e

"""The shareable adapter folder (`python -m adapter_trainer.export`; its files: docs/configuration.md) and
`load_adapter`, which rebuilds the model from it alone. A tower's weights sha256 is over its top-level weight
files, sorted by name, back to back; a hub id is looked up in the local Hugging Face cache only.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import PreTrainedConfig, PreTrainedTokenizerBase

from adapter_trainer.config import DataConfig, ModelConfig, MoTConfig, TrainConfig, TrainerConfig
from adapter_trainer.data.token_layout import AudioVocab
from adapter_trainer.errors import UserError
from adapter_trainer.model.builders import build_mot_model, load_musicgen_decoder_config, source_kwargs
from adapter_trainer.model.mot import MoTAdapterModel

ADAPTER_FORMAT = "adapter_trainer-mot-adapter"
ADAPTER_FORMAT_VERSION = 1
WEIGHTS_FILE = "adapter.safetensors"
CONFIG_FILE = "adapter_config.json"
GENERATION_FILE = "generation_config.json"
CARD_FILE = "README.md"
SAMPLING_KEYS = ("cfg_scale", "top_k", "top_p", "temperature", "seconds")  # generation_config.json's keys
REQUIRED = ("base_models", "model", "token_layout", "captions", "precision", "codec", "shards")


class AdapterError(UserError, ValueError):
    """An adapter folder cannot be used (unreadable, or its layout does not fit the base towers); one line + the fix."""


@dataclass
class LoadedAdapter:
    """What `load_adapter` gives: the model with the adapter's weights, and the folder's records."""

    model: MoTAdapterModel  # eval mode, trainable tensors fp32, frozen towers in model.dtype
    tokenizer: PreTrainedTokenizerBase
    vocab: AudioVocab
    bos_id: int
    pad_id: int
    config: TrainConfig  # model/data/trainer sections rebuilt from adapter_config.json (data.shards is empty)
    adapter_config: dict[str, Any]
    generation_config: dict[str, Any] = field(default_factory=dict)
    path: Path = Path(".")


def local_model_dir(name_or_path: str | os.PathLike) -> Path:
    """The directory holding a tower's files: the path itself, or its snapshot in the local HF cache (no download)."""
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        return p
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(name_or_path), local_files_only=True))
    except Exception as e:  # huggingface_hub raises several types (LocalEntryNotFoundError, HFValidationError, ...)
        raise FileNotFoundError(
            f"{str(name_or_path)!r} is neither a directory nor a model in the local Hugging Face cache "
            f"({type(e).__name__}); pass a local directory"
        ) from e


def weight_files(model_dir: Path) -> list[Path]:
    """The top-level weight files `from_pretrained` reads: *.safetensors when any, else *.bin / *.pt / *.pth."""
    files = sorted(p for p in model_dir.iterdir() if p.is_file())
    safetensors = [p for p in files if p.suffix == ".safetensors"]
    return safetensors or [p for p in files if p.suffix in (".bin", ".pt", ".pth")]


def weights_sha256(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """{"weights_sha256": hex, "weight_files": [names]} of a tower (a local dir or a hub id in the local cache)."""
    model_dir = local_model_dir(name_or_path)
    files = weight_files(model_dir)
    if not files:
        raise FileNotFoundError(f"no weight files (*.safetensors, *.bin) in {model_dir}")
    h = hashlib.sha256()
    for p in files:
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return {"weights_sha256": h.hexdigest(), "weight_files": [p.name for p in files]}


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from `path`, or AdapterError naming the file."""
    if not path.is_file():
        raise AdapterError(
            f"{path} not found: {what}; export one with `python -m adapter_trainer.export RUN --out DIR`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AdapterError(f"{path} is not valid JSON ({e}); export the adapter again") from e
    if not isinstance(data, dict):
        raise AdapterError(f"{path} holds a {type(data).__name__}, not a JSON object; export the adapter again")
    return data


def read_adapter_config(folder: str | Path) -> dict[str, Any]:
    """adapter_config.json, checked for its format, version and sections (AdapterError names the file)."""
    path = Path(folder) / CONFIG_FILE
    acfg = read_json(path, "an adapter folder holds adapter_config.json")
    if acfg.get("format") != ADAPTER_FORMAT or acfg.get("format_version") != ADAPTER_FORMAT_VERSION:
        raise AdapterError(
            f"{path}: format {acfg.get('format')!r} version {acfg.get('format_version')!r}, this reader takes "
            f"{ADAPTER_FORMAT!r} version {ADAPTER_FORMAT_VERSION}; export the adapter again with this adapter_trainer"
        )
    missing = [k for k in REQUIRED if not isinstance(acfg.get(k), dict)]
    if missing:
        raise AdapterError(f"{path} lacks the section(s) {missing}; export the adapter again")
    return acfg


def adapter_train_config(
    acfg: dict[str, Any], *, llm: str | None = None, audio_lm: str | None = None, device: str = "auto"
) -> TrainConfig:
    """The TrainConfig sections that build the model and encode captions (llm / audio_lm replace the recorded
    towers; data.shards stays empty)."""
    base, layout, captions = acfg["base_models"], acfg["token_layout"], acfg["captions"]
    return TrainConfig(
        data=DataConfig(
            shards=[],
            pattern=layout["pattern"],
            text=captions["text"],
            max_caption_tokens=int(captions["max_caption_tokens"]),
            max_seq_len=int(captions["max_seq_len"]),
            caption_dropout=float(captions["caption_dropout"]),
        ),
        model=ModelConfig(
            llm=str(llm or base["llm"]["name_or_path"]),
            audio_lm=str(audio_lm or base["audio_lm"]["name_or_path"]),
            dtype=acfg["precision"]["frozen_dtype"],
            mot=MoTConfig(**acfg["model"]["mot"]),
        ),
        trainer=TrainerConfig(device=device, precision=acfg["precision"]["train"], output_dir="outputs"),
    )


def check_towers(acfg: dict[str, Any], folder: Path, cfg: TrainConfig, *, check_weights: bool = True) -> None:
    """Refuse (one line) base towers whose vocabulary layout or codec K x C differ from the folder's record, and,
    with check_weights, towers whose weight files hash to other values. Reads configs and hashes files only."""
    layout, codec, where = acfg["token_layout"], acfg["codec"], folder / CONFIG_FILE
    try:
        llm_cfg, _ = PreTrainedConfig.get_config_dict(cfg.model.llm, **source_kwargs(cfg.model.llm))
        dec = load_musicgen_decoder_config(cfg.model.audio_lm)
    except (OSError, ValueError) as e:
        raise AdapterError(f"{where}: cannot read the base towers' configs: {' '.join(str(e).split())}") from e
    have = {
        "text_vocab_size": int(llm_cfg.get("vocab_size", -1)),
        "n_codebooks": int(dec.num_codebooks),
        "codebook_size": int(dec.vocab_size),
    }
    diff = [f"{k} {layout.get(k)} vs towers {v}" for k, v in have.items() if layout.get(k) != v]
    diff += [
        f"codec {k} {codec.get(k)} vs audio LM {have[k]}"
        for k in ("n_codebooks", "codebook_size")
        if codec.get(k) != have[k]
    ]
    if diff:
        raise AdapterError(
            f"{where} does not fit model.llm={cfg.model.llm} / model.audio_lm={cfg.model.audio_lm}: "
            f"{'; '.join(diff)}; pass the base towers it was trained on (recorded in base_models)"
        )
    if not check_weights:
        return
    for role, name in (("llm", cfg.model.llm), ("audio_lm", cfg.model.audio_lm)):
        want = acfg["base_models"][role].get("weights_sha256")
        try:
            got = weights_sha256(name)["weights_sha256"]
        except FileNotFoundError as e:
            raise AdapterError(f"base {role} {name!r} for {where}: {e}") from e
        if got != want:
            raise AdapterError(
                f"base {role} {name!r} has weights sha256 {got}, but {where} was trained on {want} "
                f"(base_models.{role}); pass the tower it was trained on, or check_weights=False "
                f"(generate.check_base_weights=false) to use these weights anyway"
            )


def load_adapter(
    folder: str | Path,
    *,
    llm: str | os.PathLike | None = None,
    audio_lm: str | os.PathLike | None = None,
    device: torch.device | str = "cpu",
    check_weights: bool = True,
) -> LoadedAdapter:
    """Rebuild the MoT adapter from an exported folder alone and load its trainable weights; llm / audio_lm replace
    the recorded towers. AdapterError: the folder is incomplete or does not fit the towers."""
    path = Path(folder)
    acfg = read_adapter_config(path)
    gen = read_json(path / GENERATION_FILE, "sampling defaults") if (path / GENERATION_FILE).exists() else {}
    cfg = adapter_train_config(acfg, llm=llm and str(llm), audio_lm=audio_lm and str(audio_lm))
    check_towers(acfg, path, cfg, check_weights=check_weights)
    built = build_mot_model(cfg.model, cfg.data.pattern, device, fp32_trainable=True)
    layout = acfg["token_layout"]
    ids = {"bos_id": built.bos_id, "pad_id": built.pad_id}
    if any(layout.get(k) != v for k, v in ids.items()):
        raise AdapterError(
            f"{path / CONFIG_FILE}: token_layout bos_id/pad_id {layout.get('bos_id')}/{layout.get('pad_id')} but the "
            f"tokenizer of {cfg.model.llm} gives {built.bos_id}/{built.pad_id}; pass the LLM it was trained on"
        )
    try:
        state = load_file(str(path / WEIGHTS_FILE), device="cpu")
    except (OSError, SafetensorError) as e:
        raise AdapterError(f"{path / WEIGHTS_FILE} cannot be read ({e}); export the adapter again") from e
    try:
        built.model.load_trainable_state_dict(state)
    except ValueError as e:
        raise AdapterError(f"{path / WEIGHTS_FILE} does not fit the model of {CONFIG_FILE}: {e}") from e
    return LoadedAdapter(
        model=built.model.eval(),
        tokenizer=built.tokenizer,
        vocab=built.vocab,
        bos_id=built.bos_id,
        pad_id=built.pad_id,
        config=cfg,
        adapter_config=acfg,
        generation_config=gen,
        path=path,
    )

"""A run's checkpoint -> a self-contained adapter folder (the format: `model.adapter_io`), without building the model.

The weights are the checkpoint's adapter.safetensors; the description comes from its config.yaml and fingerprint.json,
the codec identity from the training shards' manifest (which must still hash to the fingerprint's), the base towers'
weights sha256 from their files. Written to a temp dir and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from adapter_trainer.config import TrainConfig, shard_sources
from adapter_trainer.data.remote.urls import is_url, join, local_path, pin_all
from adapter_trainer.data.shards import ShardFormatError, manifest_bytes
from adapter_trainer.errors import UserError
from adapter_trainer.file_modes import save_safetensors
from adapter_trainer.model.adapter_io import (
    ADAPTER_FORMAT,
    ADAPTER_FORMAT_VERSION,
    CARD_FILE,
    CONFIG_FILE,
    GENERATION_FILE,
    SAMPLING_KEYS,
    WEIGHTS_FILE,
    weights_sha256,
)
from adapter_trainer.training.checkpoint import CKPT_DIRNAME, ResumeError, find_checkpoint

PACKAGE_VERSION = "0.1.0"


class ExportError(UserError, ValueError):
    """The run cannot be exported as it is; the message names the file or value and the fix."""


def resolve_checkpoint(run_dir: Path, checkpoint: str) -> Path:
    """`latest`, a `step-XXXXXX` name under <run>/checkpoints, or a checkpoint directory."""
    if not run_dir.is_dir():
        raise ExportError(f"run directory {run_dir} does not exist; pass the trainer.output_dir of a training run")
    try:
        if checkpoint == "latest":
            return find_checkpoint("latest", run_dir)
        named = run_dir / CKPT_DIRNAME / checkpoint
        return find_checkpoint(str(named if named.is_dir() else checkpoint), run_dir)
    except ResumeError as e:
        msg = str(e).replace("trainer.resume=latest", "--checkpoint latest").replace("trainer.resume=", "--checkpoint ")
        raise ExportError(msg) from e


def run_config(ckpt: Path) -> TrainConfig:
    """The checkpoint's resolved config.yaml as a TrainConfig (on the schema, so newer keys take their defaults)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.load(ckpt / "config.yaml"))
        typed = OmegaConf.to_object(merged)
    except Exception as e:  # omegaconf's errors share no base class but Exception
        raise ExportError(f"{ckpt / 'config.yaml'} cannot be read as a training config: {e}") from e
    assert isinstance(typed, TrainConfig), type(typed)
    return typed


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def shard_records(cfg: TrainConfig, fingerprint: dict[str, Any], out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(codec, shards) sections from the training sets' manifests, checked against the checkpoint's sha256s; the codec
    is the first set's verbatim, `path_from_set` re-based to the exported folder."""
    want = fingerprint.get("data.manifest_sha256") or []
    sets, manifests = [], []
    roots = pin_all([s.path for s in shard_sources(cfg.data.shards)], tries=cfg.data.cache.retries)
    for i, (source, root) in enumerate(zip(shard_sources(cfg.data.shards), roots)):
        try:
            mpath, raw = manifest_bytes(root, tries=cfg.data.cache.retries)  # a directory, or a URL
        except ShardFormatError as e:
            raise ExportError(
                f"{e}; the run trained on data.shards[{i}]={source.path!r}: run the export from the directory the "
                f"run was started in, or restore that shard set"
            ) from e
        sha = hashlib.sha256(raw).hexdigest()
        if i < len(want) and sha != want[i]:
            raise ExportError(
                f"{mpath} has sha256 {sha}, but the checkpoint trained on {want[i]}: the shard set changed since "
                f"training; restore the set the run trained on (its codec identity is what the folder records)"
            )
        manifest = json.loads(raw)
        manifests.append(manifest)
        splits = manifest.get("splits", {})
        sets.append(
            {
                "path": source.path,
                "manifest_sha256": sha,
                "weight": source.weight,
                "source": manifest.get("source"),
                "n_train": (splits.get(cfg.data.train_split) or {}).get("n_samples"),
                "n_eval": (splits.get(cfg.data.eval_split) or {}).get("n_samples"),
            }
        )
    codec = dict(manifests[0]["codec"])
    if codec.get("path_from_set") and is_url(roots[0]):  # a codec next to a set at a URL: named by its URL
        codec["url"] = join(roots[0], codec.pop("path_from_set"))
    elif codec.get("path_from_set"):
        codec_dir = (Path(local_path(sets[0]["path"])).expanduser() / codec["path_from_set"]).resolve()
        codec["path_from_set"] = Path(os.path.relpath(codec_dir, out.resolve())).as_posix()
    shards = {
        "format": manifests[0].get("format"),
        "format_version": manifests[0].get("format_version"),
        "codes": manifests[0].get("codes"),
        "train_split": cfg.data.train_split,
        "eval_split": cfg.data.eval_split,
        "sets": sets,
    }
    return codec, shards


def tower_record(role: str, name: str) -> dict[str, Any]:
    """A base tower: its id or path, weights sha256 and the sizes of its config.json."""
    from transformers import PreTrainedConfig

    try:
        ident = weights_sha256(name)
        cfg, _ = PreTrainedConfig.get_config_dict(name)
    except (OSError, ValueError) as e:
        raise ExportError(
            f"model.{role}={name!r}: {' '.join(str(e).split())}; export where the base towers of the run are "
            f"available (the same directory or Hugging Face cache)"
        ) from e
    sizes = cfg.get("decoder", cfg) if cfg.get("model_type") == "musicgen" else cfg
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_codebooks")
    return {
        "name_or_path": name,
        **ident,
        "model_type": cfg.get("model_type"),
        **{k: sizes[k] for k in keep if k in sizes},
    }


def generation_defaults(run_dir: Path, ckpt: Path) -> dict[str, Any]:
    """Sampling defaults: the run's generated set's when sampled from this checkpoint, else generate's defaults."""
    from adapter_trainer.generation.config import GenerateConfig

    defaults = asdict(GenerateConfig())
    gen = (_json(run_dir / "generated" / "manifest.json") or {}).get("generated") or {}
    sampling = gen.get("sampling") or {}
    same = Path(str(gen.get("checkpoint", ""))).name == ckpt.name
    out = {k: sampling[k] if same and k in sampling else defaults[k] for k in SAMPLING_KEYS}
    return {**out, "source": str(run_dir / "generated") if same and sampling else "adapter_trainer.generate defaults"}


def run_reports(run_dir: Path, ckpt: Path, step: int) -> dict[str, Any]:
    """The run's measurements, each with the checkpoint step it was measured on (None when it does not say)."""
    final = _json(run_dir / "final_metrics.json")
    gen = (_json(run_dir / "generated" / "manifest.json") or {}).get("generated") or {}
    probe = _json(run_dir / "generation_report.json")
    reports: dict[str, Any] = {"exported_step": step}
    if final:
        reports["learning_check"] = {"step": final.get("step"), **(final.get("learning_check") or {})}
    if probe:
        reports["probe"] = {"step": (probe.get("sampling") or {}).get("checkpoint_step"), **probe}
    audio = _json(run_dir / "audio_metrics.json")
    if audio:
        reports["audio_metrics"] = {"step": gen.get("checkpoint_step"), **audio}
    return reports


def adapter_config(run_dir: Path, ckpt: Path, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(adapter_config.json, the run's reports for the card) of checkpoint `ckpt`."""
    cfg = run_config(ckpt)
    fingerprint = json.loads((ckpt / "fingerprint.json").read_text(encoding="utf-8"))
    progress = json.loads((ckpt / "progress.json").read_text(encoding="utf-8"))
    codec, shards = shard_records(cfg, fingerprint, out)
    V, K, C = fingerprint["vocab"]
    from adapter_trainer.model.builders import load_text_tokenizer, special_ids

    try:
        bos_id, pad_id = special_ids(load_text_tokenizer(cfg.model.llm))
    except OSError as e:
        raise ExportError(f"model.llm={cfg.model.llm!r}: {' '.join(str(e).split())}") from e
    shapes = fingerprint["trainable_shapes"]
    n_params = sum(math.prod(s) for s in shapes.values())
    acfg = {
        "format": ADAPTER_FORMAT,
        "format_version": ADAPTER_FORMAT_VERSION,
        "created_by": {"package": "adapter_trainer", "version": PACKAGE_VERSION},
        "base_models": {
            "llm": tower_record("llm", cfg.model.llm),
            "audio_lm": tower_record("audio_lm", cfg.model.audio_lm),
        },
        "model": {
            "architecture": "MusicgenRowsMoT" if cfg.model.mot.audio_tower == "musicgen" else "MoTAdapterModel",
            "mot": asdict(cfg.model.mot),
            "trainable_params": n_params,
        },
        "token_layout": {
            "text_vocab_size": V,
            "n_codebooks": K,
            "codebook_size": C,
            "pattern": cfg.data.pattern,
            "bos_id": bos_id,
            "pad_id": pad_id,
            "audio_ids": "text ids, then K x C codes (codebook k, code c -> V + k*C + c), then AUDIO_START/END/PAD",
        },
        "captions": {
            "text": cfg.data.text,
            "max_caption_tokens": cfg.data.max_caption_tokens,
            "max_seq_len": cfg.data.max_seq_len,
            "caption_dropout": cfg.data.caption_dropout,
        },
        "precision": {"train": cfg.trainer.precision, "frozen_dtype": cfg.model.dtype, "trainable_dtype": "float32"},
        "codec": codec,
        "shards": shards,
        "training": {
            "run_dir": str(run_dir),
            "checkpoint": ckpt.name,
            "step": progress.get("step"),
            "tokens_seen": progress.get("tokens_seen"),
            "trainable_shapes": shapes,
            "fingerprint": fingerprint,
        },
    }
    return acfg, run_reports(run_dir, ckpt, int(progress.get("step", 0)))


def export_adapter(
    run_dir: str | Path,
    out: str | Path,
    *,
    checkpoint: str = "latest",
    license: str = "other",
    overwrite: bool = False,
) -> Path:
    """Write the adapter folder of `run_dir`'s checkpoint to `out` (temp dir + rename); returns `out`."""
    from safetensors.torch import load_file

    from adapter_trainer.sharing.model_card import model_card

    run, out = Path(run_dir), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ExportError(f"{out} is not empty; pass --overwrite to replace it or choose another --out")
    ckpt = resolve_checkpoint(run, checkpoint)
    acfg, reports = adapter_config(run, ckpt, out)
    gen = generation_defaults(run, ckpt)
    tensors = load_file(str(ckpt / WEIGHTS_FILE))  # name -> fp32 tensor, the trainable weights only
    tmp = out.parent / f".{out.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)  # left by an export killed mid-write
    tmp.mkdir(parents=True)
    save_safetensors(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt", "adapter_format": ADAPTER_FORMAT})
    (tmp / CONFIG_FILE).write_text(json.dumps(acfg, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    (tmp / GENERATION_FILE).write_text(json.dumps(gen, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    (tmp / CARD_FILE).write_text(model_card(acfg, gen, reports, license=license, name=out.name), encoding="utf-8")
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    tmp.rename(out)
    return out

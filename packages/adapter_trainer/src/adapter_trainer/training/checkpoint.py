"""Checkpoints: `<output_dir>/checkpoints/step-XXXXXX/`, written to a temp dir and renamed into place.

    adapter.safetensors   trainable weights only        optimizer.pt / scheduler.pt / scaler.pt (fp16)
    rng_torch.pt, rng.json  RNG states                 progress.json  TrainingProgress
    fingerprint.json      what must match on resume     config.yaml    the resolved TrainConfig

Resume refuses (ResumeError) a fingerprint that differs: architecture, data identity and what fixes the example
stream. The config wins for every optimizer.* value and trainer.max_steps (each change printed); the checkpoint
gives AdamW's moments and the step count. A fresh run refuses an output_dir holding checkpoints unless
trainer.overwrite=true.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from adapter_trainer.config import TrainConfig, shard_weights
from adapter_trainer.data.token_layout import AudioVocab
from adapter_trainer.errors import DISK_FULL, CheckpointWriteError, UserError
from adapter_trainer.file_modes import save_safetensors

CKPT_DIRNAME = "checkpoints"
STEP_FMT = "step-{:06d}"


class ResumeError(UserError, ValueError):
    """The checkpoint cannot continue this run; the message names the checkpoint, the difference and the fix."""


@dataclass
class TrainingProgress:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # pass over the train split the next example comes from
    index: int = 0  # position of the next example in that epoch's permutation
    tokens_seen: int = 0  # input tokens (non-pad) consumed so far
    train_sequences: int = 0  # training sequences (examples, all ranks)
    train_end_targets: int = 0  # those with an AUDIO_END target in their loss mask


@dataclass
class LoadedCheckpoint:
    path: Path
    adapter: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    scaler: dict[str, Any] | None
    rng_torch: dict[str, Any]
    rng: dict[str, Any]
    progress: TrainingProgress
    fingerprint: dict[str, Any]


def capture_rng() -> tuple[dict[str, Any], dict[str, Any]]:
    """(torch states for torch.save, python/numpy states for JSON)."""
    torch_states: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        torch_states["cuda"] = torch.cuda.get_rng_state_all()
    np_state = np.random.get_state()
    py_state = random.getstate()
    other = {
        "python": [py_state[0], list(py_state[1]), py_state[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    return torch_states, other


def restore_rng(torch_states: dict[str, Any], other: dict[str, Any]) -> None:
    """Restore the saved generator states (CUDA: only for the devices this process has)."""
    torch.set_rng_state(torch_states["cpu"])
    if "cuda" in torch_states and torch.cuda.is_available():
        for device, state in enumerate(torch_states["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, device)
    v, state, gauss = other["python"]
    random.setstate((v, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = other["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def save_checkpoint(
    output_dir: str | Path,
    *,
    adapter: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    progress: TrainingProgress,
    fingerprint: dict[str, Any],
    config_yaml: str,
) -> Path:
    """Write `<output_dir>/checkpoints/step-XXXXXX/` atomically (temp dir + rename). Returns its path."""
    root = Path(output_dir) / CKPT_DIRNAME
    root.mkdir(parents=True, exist_ok=True)
    final = root / STEP_FMT.format(progress.step)
    tmp = root / f".{final.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a run killed mid-write: never read, safe to drop
    try:
        tmp.mkdir()
        save_safetensors({k: v.detach().contiguous().cpu() for k, v in adapter.items()}, tmp / "adapter.safetensors")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        if scaler is not None:
            torch.save(scaler.state_dict(), tmp / "scaler.pt")
        torch_rng, other_rng = capture_rng()
        torch.save(torch_rng, tmp / "rng_torch.pt")
        (tmp / "rng.json").write_text(json.dumps(other_rng, allow_nan=False))
        (tmp / "progress.json").write_text(json.dumps(asdict(progress), indent=2, allow_nan=False) + "\n")
        (tmp / "fingerprint.json").write_text(json.dumps(fingerprint, indent=2, sort_keys=True, allow_nan=False) + "\n")
        (tmp / "config.yaml").write_text(config_yaml)
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError of its C++ writer
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written stays beside the complete checkpoints
        if isinstance(e, OSError) and e.errno is None:
            raise
        raise CheckpointWriteError(f"checkpoint {final.name} not written: {_why_not_written(e, root)}") from None
    if final.exists():
        shutil.rmtree(final)  # re-saving the same step (e.g. the final checkpoint after a periodic one)
    tmp.rename(final)
    return final


FULL_BELOW_BYTES = 64 << 20  # a filesystem with less free space than this is reported as full


def _why_not_written(e: OSError | RuntimeError, root: Path) -> str:
    """Why a checkpoint write failed, in words: the filesystem is full (by errno, or by its free space when torch's
    writer raised), or the error itself."""
    full = isinstance(e, OSError) and e.errno in DISK_FULL
    with contextlib.suppress(OSError):  # no figure: the errno decides
        full = full or shutil.disk_usage(root).free < FULL_BELOW_BYTES
    if full:
        return f"the filesystem of {root} is full; free space there"
    cause = e.strerror if isinstance(e, OSError) else " ".join(str(e).split())[:200]
    return f"a write into {root} failed ({cause}); fix that"


def find_checkpoint(resume: str, output_dir: str | Path) -> Path:
    """`latest` -> newest step dir under <output_dir>/checkpoints; otherwise the given directory."""
    if resume == "latest":
        root = Path(output_dir) / CKPT_DIRNAME
        steps = sorted(p for p in root.glob("step-*") if p.is_dir()) if root.is_dir() else []
        if not steps:
            raise ResumeError(
                f"trainer.resume=latest but {root} holds no step-* checkpoint; set trainer.output_dir "
                f"to the run to continue, pass trainer.resume=/path/to/step-XXXXXX, or drop trainer.resume"
            )
        return steps[-1]
    path = Path(resume)
    if not (path / "progress.json").is_file():
        raise ResumeError(
            f"trainer.resume={resume}: {path / 'progress.json'} not found; pass a "
            f"checkpoints/step-XXXXXX directory or trainer.resume=latest"
        )
    return path


def load_checkpoint(path: str | Path) -> LoadedCheckpoint:
    """Read everything back to the CPU (weights_only loads: no pickled code runs)."""
    path = Path(path)
    scaler_path = path / "scaler.pt"
    return LoadedCheckpoint(
        path=path,
        adapter=load_file(str(path / "adapter.safetensors"), device="cpu"),
        optimizer=torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True),
        scheduler=torch.load(path / "scheduler.pt", weights_only=True),
        scaler=torch.load(scaler_path, weights_only=True) if scaler_path.exists() else None,
        rng_torch=torch.load(path / "rng_torch.pt", weights_only=True),
        rng=json.loads((path / "rng.json").read_text()),
        progress=_read_progress(path / "progress.json"),
        fingerprint=json.loads((path / "fingerprint.json").read_text()),
    )


def _read_progress(path: Path) -> TrainingProgress:
    """progress.json, holding exactly TrainingProgress's fields."""
    saved = json.loads(path.read_text())
    want = {f.name for f in fields(TrainingProgress)}
    if set(saved) != want:
        raise ResumeError(
            f"{path.parent}: progress.json holds {sorted(saved)}, not this adapter_trainer's checkpoint layout "
            f"{sorted(want)}; retrain (a fresh run: a new trainer.output_dir or trainer.overwrite=true)"
        )
    return TrainingProgress(**saved)


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], ckpt: Path) -> None:
    """Raise ResumeError listing every key whose value differs between the checkpoint and this run."""
    diffs = [k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    if not diffs:
        return
    was, now = (dict(f.get("model.mot") or {}).get("audio_tower") for f in (saved, current))
    if was != now:  # the other tower is another model: every other difference follows from it
        raise ResumeError(
            f"cannot resume from {ckpt}: it trained model.mot.audio_tower={was}, this run model.mot.audio_tower="
            f"{now}; add model.mot.audio_tower={was} to resume it, or start a fresh run with a new trainer.output_dir"
        )
    parts = [_differs(k, saved.get(k), current.get(k)) for k in diffs]
    if "data.manifest_sha256" in diffs:
        parts.append(
            "a shard set's manifest changed: for a set at a URL whose branch moved, give data.shards the revision the "
            "run started from (data_sources.json in the run's output_dir records it)"
        )
    raise ResumeError(  # one line: the CLI prints it as the whole refusal
        f"cannot resume from {ckpt}: the run differs from the checkpoint in " + "; ".join(parts) + ". "
        f"Architecture and data must match to continue (see {ckpt / 'config.yaml'}). Restore those config values "
        f"(or the same shard sets), or start a fresh run without trainer.resume / with a new trainer.output_dir."
    )


def _differs(key: str, saved: Any, current: Any) -> str:
    """`key: checkpoint=... run=...`; for dicts only the entries that differ (a shapes table can be long)."""
    if isinstance(saved, dict) and isinstance(current, dict):
        sub = [s for s in sorted(set(saved) | set(current)) if saved.get(s) != current.get(s)]
        return ", ".join(f"{key}.{s}: checkpoint={saved.get(s)!r} run={current.get(s)!r}" for s in sub)
    return f"{key}: checkpoint={saved!r} run={current!r}"


OPTIMIZER_GROUP_KEYS = ("initial_lr", "betas", "weight_decay", "eps")  # per-group values the config decides
# AdamW's kernel choice: THIS run's device decides it (fused on MPS), not the device that wrote the checkpoint; set
# before load_state_dict, which places each group's `step` tensors by it (on the device for fused, else on the host)
KERNEL_GROUP_KEYS = ("fused", "foreach", "capturable")


def prepare_output_dir(output_dir: str | Path, *, resume: str | None, overwrite: bool) -> None:
    """A fresh run refuses (ResumeError) an output_dir that holds step-* checkpoints; `overwrite` deletes them."""
    root = Path(output_dir) / CKPT_DIRNAME
    old = sorted(p.name for p in root.glob("step-*")) if root.is_dir() else []
    if resume or not old:
        return
    if not overwrite:
        raise ResumeError(
            f"trainer.output_dir={output_dir} already holds checkpoints from an earlier run ({', '.join(old[-3:])}); "
            f"a fresh run would mix with them and a later trainer.resume=latest could pick a stale one. Continue that "
            f"run with trainer.resume=latest, delete its checkpoints with trainer.overwrite=true, or choose a new "
            f"trainer.output_dir"
        )
    shutil.rmtree(root)
    print(f"trainer.overwrite=true: deleted {len(old)} old checkpoint(s) under {root}")


def load_optimizer_with_config(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    optimizer_state: dict[str, Any],
    scheduler_state: dict[str, Any],
    lr_factor: Any,
) -> None:
    """Restore AdamW's moments and the scheduler's step count, keeping THIS run's hyper-parameters and kernel choice
    (read before `load_state_dict`, written back after); the LR becomes lr * lr_factor(step)."""
    fresh = [{k: g[k] for k in OPTIMIZER_GROUP_KEYS} for g in optimizer.param_groups]
    saved = [len(g["params"]) for g in optimizer_state["param_groups"]]
    if saved != [len(g["params"]) for g in optimizer.param_groups]:
        raise ResumeError(
            f"the checkpoint's AdamW groups hold {saved} tensors, this run's {[len(g['params']) for g in optimizer.param_groups]}: "
            f"it was written for another model or checkpoint layout; retrain (a fresh run: trainer.overwrite=true or "
            f"another trainer.output_dir)"
        )
    kernels = [{k: g[k] for k in KERNEL_GROUP_KEYS if k in g} for g in optimizer.param_groups]
    groups = [{**saved_group, **k} for saved_group, k in zip(optimizer_state["param_groups"], kernels)]
    optimizer.load_state_dict({**optimizer_state, "param_groups": groups})
    scheduler.load_state_dict(scheduler_state)
    for g, f in zip(optimizer.param_groups, fresh):
        g.update(f)
    scheduler.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = g["initial_lr"] * lr_factor(scheduler.last_epoch)
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]  # what get_last_lr() reports (torch keeps no setter)


def optimizer_changes(ckpt: Path, current: dict[str, Any]) -> list[str]:
    """`optimizer.<key>: checkpoint -> run` for each optimizer.* value that differs from the checkpoint's config.yaml."""
    from omegaconf import OmegaConf

    saved = OmegaConf.to_container(OmegaConf.load(ckpt / "config.yaml")).get("optimizer", {})
    return [f"optimizer.{k}: {saved.get(k)!r} -> {v!r}" for k, v in current.items() if saved.get(k) != v]


def max_steps_change(ckpt: Path, max_steps: int) -> list[str]:
    """`trainer.max_steps: checkpoint -> run` when it differs from the checkpoint's config.yaml, else []."""
    from omegaconf import OmegaConf

    saved = OmegaConf.to_container(OmegaConf.load(ckpt / "config.yaml")).get("trainer", {}).get("max_steps")
    return [] if saved in (None, max_steps) else [f"trainer.max_steps: {saved!r} -> {max_steps!r}"]


def run_fingerprint(cfg: TrainConfig, vocab: AudioVocab, model: torch.nn.Module, shard_sets: list) -> dict[str, Any]:
    """What a resumed run (and `generate`) must share with the checkpoint: architecture, data identity, example stream."""
    c = cfg
    fingerprint = {
        "data.start_crop_prob": c.data.start_crop_prob,
        "model.llm": c.model.llm,
        "model.audio_lm": c.model.audio_lm,
        "model.dtype": c.model.dtype,
        "model.mot": asdict(c.model.mot),
        "data.pattern": c.data.pattern,
        # the example order (epoch shuffle, crops) and the sequences themselves:
        "trainer.seed": c.trainer.seed,
        "data.text": c.data.text,
        "data.max_seq_len": c.data.max_seq_len,
        "data.max_caption_tokens": c.data.max_caption_tokens,
        "data.caption_dropout": c.data.caption_dropout,
        "vocab": [vocab.text_vocab_size, vocab.n_codebooks, vocab.codebook_size],
        "trainable_shapes": {k: list(v.shape) for k, v in model.trainable_state_dict().items()},
        "data.manifest_sha256": [s.manifest_sha256 for s in shard_sets],
        "data.splits": [c.data.train_split, c.data.eval_split],
    }
    weights = shard_weights(c.data.shards)
    if weights is not None:  # only for mixtures
        fingerprint["data.mixture"] = {"weights": weights, "epoch_size": c.data.mixture_epoch_size}
    return fingerprint

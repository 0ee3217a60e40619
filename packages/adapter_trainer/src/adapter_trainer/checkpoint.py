"""Checkpoints: `<output_dir>/checkpoints/step-XXXXXX/`, written to a temp dir and renamed into place.

    adapter.safetensors   trainable weights only (the frozen LLM / MusicGen weights come from model.llm / audio_lm)
    optimizer.pt          AdamW state          scheduler.pt   LambdaLR state      scaler.pt  GradScaler (fp16 only)
    rng_torch.pt          torch CPU (+ CUDA) RNG states     rng.json  python + numpy global RNG states
    progress.json         TrainingProgress (step, epoch, index, tokens_seen)
    fingerprint.json      what must match on resume: model ids, dtype, mot config, pattern, codec sizes, the
                          trainable-parameter shapes and the shard manifests' sha256s (in data.shards order)
    config.yaml           the resolved TrainConfig

Resume refuses (ResumeError) when the fingerprint differs: nanoGPT takes the architecture from the checkpoint;
here the config must agree, so a silently different model or dataset can never continue a run.
"""
from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

CKPT_DIRNAME = "checkpoints"
STEP_FMT = "step-{:06d}"


class ResumeError(ValueError):
    """The checkpoint cannot continue this run; the message names the checkpoint, the difference and the fix."""


@dataclass
class TrainingProgress:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # pass over the train split the next example comes from
    index: int = 0  # position of the next example in that epoch's permutation
    tokens_seen: int = 0  # input tokens (non-pad) consumed so far


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
    torch.set_rng_state(torch_states["cpu"])
    if "cuda" in torch_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(torch_states["cuda"])
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
    tmp.mkdir()
    save_file({k: v.detach().contiguous().cpu() for k, v in adapter.items()}, str(tmp / "adapter.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    if scaler is not None:
        torch.save(scaler.state_dict(), tmp / "scaler.pt")
    torch_rng, other_rng = capture_rng()
    torch.save(torch_rng, tmp / "rng_torch.pt")
    (tmp / "rng.json").write_text(json.dumps(other_rng))
    (tmp / "progress.json").write_text(json.dumps(asdict(progress), indent=2) + "\n")
    (tmp / "fingerprint.json").write_text(json.dumps(fingerprint, indent=2, sort_keys=True) + "\n")
    (tmp / "config.yaml").write_text(config_yaml)
    if final.exists():
        shutil.rmtree(final)  # re-saving the same step (e.g. the final checkpoint after a periodic one)
    tmp.rename(final)
    return final


def find_checkpoint(resume: str, output_dir: str | Path) -> Path:
    """`latest` -> newest step dir under <output_dir>/checkpoints; otherwise the given directory."""
    if resume == "latest":
        root = Path(output_dir) / CKPT_DIRNAME
        steps = sorted(p for p in root.glob("step-*") if p.is_dir()) if root.is_dir() else []
        if not steps:
            raise ResumeError(f"trainer.resume=latest but {root} holds no step-* checkpoint; set trainer.output_dir "
                              f"to the run to continue, pass trainer.resume=/path/to/step-XXXXXX, or drop trainer.resume")
        return steps[-1]
    path = Path(resume)
    if not (path / "progress.json").is_file():
        raise ResumeError(f"trainer.resume={resume}: {path / 'progress.json'} not found; pass a "
                          f"checkpoints/step-XXXXXX directory or trainer.resume=latest")
    return path


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> LoadedCheckpoint:
    """Read everything back (weights_only loads: no pickled code runs)."""
    path = Path(path)
    scaler_path = path / "scaler.pt"
    return LoadedCheckpoint(
        path=path,
        adapter=load_file(str(path / "adapter.safetensors"), device=str(device)),
        optimizer=torch.load(path / "optimizer.pt", map_location=device, weights_only=True),
        scheduler=torch.load(path / "scheduler.pt", weights_only=True),
        scaler=torch.load(scaler_path, weights_only=True) if scaler_path.exists() else None,
        rng_torch=torch.load(path / "rng_torch.pt", weights_only=True),
        rng=json.loads((path / "rng.json").read_text()),
        progress=TrainingProgress(**json.loads((path / "progress.json").read_text())),
        fingerprint=json.loads((path / "fingerprint.json").read_text()),
    )


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], ckpt: Path) -> None:
    """Raise ResumeError listing every key whose value differs between the checkpoint and this run."""
    diffs = [k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    if not diffs:
        return
    lines = [f"  {k}: checkpoint={saved.get(k)!r} run={current.get(k)!r}" for k in diffs]
    raise ResumeError(
        f"cannot resume from {ckpt}: the run differs from the checkpoint in\n" + "\n".join(lines) + "\n"
        f"Architecture and data must match to continue (see {ckpt / 'config.yaml'}). Restore those config values "
        f"(or the same shard sets), or start a fresh run without trainer.resume / with a new trainer.output_dir."
    )

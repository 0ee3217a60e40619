"""Checkpoints: `<output_dir>/checkpoints/step-XXXXXX/`, written to a temp dir and renamed into place.

    adapter.safetensors   trainable weights only (the frozen LLM / MusicGen weights come from model.llm / audio_lm)
    optimizer.pt          AdamW state          scheduler.pt   LambdaLR state      scaler.pt  GradScaler (fp16 only)
    rng_torch.pt          torch CPU (+ CUDA) RNG states     rng.json  python + numpy global RNG states
    progress.json         TrainingProgress (step, epoch, index, tokens_seen; training windows and those with an
                          AUDIO_END target, for the learning check's END CE line)
    fingerprint.json      what must match on resume: model ids, dtype, mot config, pattern, codec sizes, the
                          trainable-parameter shapes and the shard manifests' sha256s (in data.shards order);
                          for a weighted mixture also its weights and data.mixture_epoch_size
    config.yaml           the resolved TrainConfig

Resume refuses (ResumeError) when the fingerprint differs: nanoGPT takes the architecture from the checkpoint;
here the config must agree, so a silently different model or dataset can never continue a run. The fingerprint
also holds what fixes the example order and the sequences (trainer.seed, data.text, data.max_seq_len,
data.max_caption_tokens, data.pattern): changing those mid-run would silently train on another stream.

Optimizer settings are the other way round: on resume the CONFIG wins for every optimizer.* value (lr, betas,
weight_decay, warmup_steps, min_lr_ratio, grad_clip) and for trainer.max_steps; the checkpoint contributes
AdamW's moments and the step count. Every changed value is printed (`optimizer_changes`), never silent.

A fresh run (no trainer.resume) refuses an output_dir that already holds checkpoints, so `resume=latest` can
never later pick a stale one; trainer.overwrite=true deletes them first (`prepare_output_dir`).
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
from safetensors.torch import load_file

from adapter_trainer.config import TrainConfig, mot_fields, shard_weights
from adapter_trainer.data.token_layout import AudioVocab
from adapter_trainer.errors import UserError
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
    # training windows (examples, all ranks) since step `counted_from_step`, and those with an AUDIO_END target in
    # their loss mask (the learning check's END CE line); counted_from_step > 0 only after resuming a checkpoint
    # written before these counts existed (`load_checkpoint`), so a partial count is never shown as the whole run's
    train_windows: int = 0
    train_end_targets: int = 0
    counted_from_step: int = 0


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
    """Restore the saved generator states. CUDA: only for the devices this process has (a checkpoint from 8 GPUs
    resumes on 1, or under a narrower CUDA_VISIBLE_DEVICES); training never draws from the CUDA generators."""
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
    """Read everything back to the CPU (weights_only loads: no pickled code runs). The model's and the optimizer's
    load_state_dict move the tensors to their parameters' device (one path for every device; older safetensors refused
    mps device strings)."""
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
    """progress.json; one written before the window counts existed restarts them at its step (counted_from_step)."""
    saved = json.loads(path.read_text())
    if "train_windows" not in saved:
        saved = {**saved, "train_windows": 0, "train_end_targets": 0, "counted_from_step": saved["step"]}
    return TrainingProgress(**saved)


# trainable tensors added after checkpoints existed; a checkpoint without them loads them as the zeros that are exactly
# the model it was (MoTAdapterModel.upgrade_trainable_state), so their absence is not a difference
LATER_TRAINABLE = ("special_code_embed",)


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], ckpt: Path) -> None:
    """Raise ResumeError listing every key whose value differs between the checkpoint and this run."""
    shapes, now = saved.get("trainable_shapes"), current.get("trainable_shapes")
    if isinstance(shapes, dict) and isinstance(now, dict):
        later = {k for k in LATER_TRAINABLE if k not in shapes}
        current = {**current, "trainable_shapes": {k: v for k, v in now.items() if k not in later}}
    diffs = [k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    if not diffs:
        return
    tower = "model.mot.audio_tower"
    if tower in diffs:  # the other tower is another model: every other difference follows from it
        was = saved.get(tower) or "llm"  # checkpoints record the tower only when it is not llm
        raise ResumeError(
            f"cannot resume from {ckpt}: it trained model.mot.audio_tower={was}, this run model.mot.audio_tower="
            f"{current.get(tower) or 'llm'} (mps_small and cuda_1b train musicgen since 2026-11-28); add "
            f"model.mot.audio_tower={was} to resume it, or start a fresh run with a new trainer.output_dir"
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
    """A fresh run refuses an output_dir that holds step-* checkpoints; with `overwrite` it deletes them.

    Raises:
        ResumeError: checkpoints exist, no trainer.resume and no trainer.overwrite; the message names both.
    """
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
    """Restore AdamW's moments and the scheduler's step count; keep THIS run's hyper-parameters and kernel choice.

    `optimizer` and `scheduler` were just built from the config; `load_state_dict` would put the checkpoint's lr,
    betas, weight_decay and eps back, so they are read before loading and written again after. The LR is then
    recomputed as lr * lr_factor(step), exactly what an uninterrupted run with this config would use.
    """
    fresh = [{k: g[k] for k in OPTIMIZER_GROUP_KEYS} for g in optimizer.param_groups]
    saved = [len(g["params"]) for g in optimizer_state["param_groups"]]
    if saved != [len(g["params"]) for g in optimizer.param_groups]:
        raise ResumeError(
            f"the checkpoint's AdamW groups hold {saved} tensors, this run's {[len(g['params']) for g in optimizer.param_groups]}: "
            f"it was written before copies of pretrained weights got their own groups (optimizer.pretrained_copy_lr_scale), "
            f"before AUDIO_START/PAD/END read MusicGen's rows (special_code_embed, 2026-11-27; such a checkpoint still "
            f"samples and exports as it was) or for another model; start a fresh run (trainer.overwrite=true or another "
            f"trainer.output_dir)"
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
    """`trainer.max_steps: checkpoint -> run` when the run trains to another step than the checkpoint's config.yaml
    said (the LR schedule's cosine then ends elsewhere), else []."""
    from omegaconf import OmegaConf

    saved = OmegaConf.to_container(OmegaConf.load(ckpt / "config.yaml")).get("trainer", {}).get("max_steps")
    return [] if saved in (None, max_steps) else [f"trainer.max_steps: {saved!r} -> {max_steps!r}"]


def run_fingerprint(cfg: TrainConfig, vocab: AudioVocab, model: torch.nn.Module, shard_sets: list) -> dict[str, Any]:
    """What a resumed run (and `generate`) must share with the checkpoint: architecture, data identity, example stream."""
    c = cfg
    # Settings added after checkpoints already existed are recorded only when set, so those checkpoints stay resumable.
    defaults_then = {"caption_cond_rank": 0, "audio_tower": "llm"}  # added later: recorded only when set otherwise
    # audio_tower=musicgen's caption-path keys: recorded with that tower alone, and only where they differ from what
    # its checkpoints before them were (zero_gate: the default since is zero_proj, whose gate means another thing)
    tower_then = {"caption_init": "zero_gate", "caption_projection": "per_layer", "caption_layer": -1,
                  "cross_attention": "train"}  # fmt: skip
    musicgen = c.model.mot.audio_tower == "musicgen"
    mot = {
        k: v
        for k, v in mot_fields(c).items()
        if not (k in defaults_then and v == defaults_then[k])
        and not (k in tower_then and (v == tower_then[k] or not musicgen))
    }
    later = {
        k: v
        for k, v in (
            ("data.start_crop_prob", c.data.start_crop_prob),
            ("data.caption_word_dropout", c.data.caption_word_dropout),
        )
        if v
    }
    fingerprint = {
        **later,
        "model.llm": c.model.llm,
        "model.audio_lm": c.model.audio_lm,
        "model.dtype": c.model.dtype,
        "model.mot": mot,
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
    weights = shard_weights(c)
    if weights is not None:  # only for mixtures: checkpoints of concatenated sets keep their fingerprint
        fingerprint["data.mixture"] = {"weights": weights, "epoch_size": c.data.mixture_epoch_size}
    return fingerprint

"""The end of a run (rank 0): failures.jsonl, manifest.json (written last) and the summary with the exit status."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from ..audio.read_audio import FFMPEG_FIX
from ..config import PipelineConfig
from ..hydra_cli import hydra_value, shell_word
from ..shards.manifest import CodecInfo, FailureRecord, Manifest, SplitSummary, write_failures_jsonl, write_text_atomic
from ..shards.write_shards import ShardPlan
from .index_parts import write_indexes
from .progress import ProgressStore, ShardRecord

DROPPED_REASONS = ("short_track", "short_tail")  # your own audio's dropped short tracks / tails (sources/plan.py)


@dataclass(frozen=True)
class RunResult:
    manifest: Manifest
    out_dir: Path
    exit_code: int  # 0 ok; 1 nothing encoded or too many failures
    message: str


def write_manifest(
    cfg: PipelineConfig, plans: list[ShardPlan], store: ProgressStore, codec_info: CodecInfo, source: dict,
    segmentation: dict | None, resolved: dict, n_rows: int, dropped: list[FailureRecord] | None = None,
) -> RunResult:  # fmt: skip
    """`dropped`: your own audio's short tracks and tails (short_track / short_tail): failures.jsonl lines and rows
    like any failure, but not counted toward max_failure_fraction (a tail shorter than min_seconds is by design)."""
    out_dir = store.out_dir
    dropped = list(dropped or [])
    n_rows += len(dropped)
    records: list[ShardRecord] = []
    for plan in plans:
        rec = store.completed(plan)
        if rec is None:
            raise RuntimeError(f"{out_dir / plan.relpath}: no valid shard after all ranks finished; rerun to redo it")
        records.append(rec)
    split_names = [cfg.split.train_name, cfg.split.eval_name]
    store.remove_stale(plans, split_names)  # a split that now has fewer shards (your own audio: a track got shorter)
    by_split = {split: [r for r, p in zip(records, plans) if p.split == split] for split in split_names}
    indexes = write_indexes(  # each split's index sidecar (format 5), from the shards' parts
        out_dir, store.dir, {s: [r.entry for r in recs] for s, recs in by_split.items()},
        codec_info.n_codebooks, codec_info.codebook_size,
    )  # fmt: skip
    splits = {
        split: SplitSummary(
            shards=[r.entry for r in recs], n_samples=sum(r.entry.n_samples for r in recs),
            audio_seconds=round(sum(r.audio_seconds for r in recs), 6), n_frames=sum(r.n_frames for r in recs),
            index=indexes[split],
        )
        for split, recs in by_split.items()
    }  # fmt: skip
    failures = sorted([*(f for r in records for f in r.failures), *dropped], key=lambda f: f.csv_row)
    encoded = sum(s.n_samples for s in splits.values())
    totals = {
        "rows": n_rows, "encoded": encoded, "failed": len(failures),
        "audio_seconds": round(sum(s.audio_seconds for s in splits.values()), 6),
        "n_frames": sum(s.n_frames for s in splits.values()),
    }  # fmt: skip
    manifest = Manifest(codec=codec_info, splits=splits, totals=totals, failures=failures, source=source,
                        config=resolved, segmentation=segmentation)  # fmt: skip
    assert manifest.totals["encoded"] + manifest.totals["failed"] == n_rows
    write_failures_jsonl(out_dir / "failures.jsonl", failures)
    write_text_atomic(out_dir / "manifest.json", manifest.to_json())

    # summary and exit status
    lines = [f"shard set: {out_dir} ({sum(len(s.shards) for s in splits.values())} shards)"]
    for name, s in splits.items():
        n_failed = sum(f.split == name for f in failures if f.reason not in DROPPED_REASONS)
        lines.append(
            f"  {name}: {s.n_samples} encoded, {n_failed} failed, {s.audio_seconds / 3600:.3f} h audio, {s.n_frames} frames"
        )
    n_short, n_tails = (sum(f.reason == r for f in dropped) for r in DROPPED_REASONS)
    if dropped:
        lines.append(
            f"  dropped as shorter than segment.min_seconds: {n_short} whole tracks (short_track), {n_tails} last "
            "segments (short_tail); each is a line of failures.jsonl, none counts toward max_failure_fraction"
        )
    n_ffmpeg = sum(f.reason == "needs_ffmpeg" for f in failures)
    if n_ffmpeg:
        lines.append(
            f"  {n_ffmpeg} clips need FFmpeg, which is not available here: {FFMPEG_FIX}; "
            "then rerun the same command (no overwrite) to encode just those"
        )
    n_retry = sum(f.retryable for f in failures)
    if n_retry:
        lines.append(
            f"  {n_retry} failures are retryable (retryable: true in failures.jsonl: missing audio, FFmpeg, encode "
            "errors, out of memory); rerun the same command to retry them"
        )
    code, msg = 0, "ok"
    n_real = len(failures) - len(dropped)  # failures that count: a dropped short track or tail is planned, not failed
    frac = n_real / max(n_rows - len(dropped), 1)
    failures_file = out_dir / "failures.jsonl"
    if encoded == 0:
        code, msg = 1, f"nothing could be encoded: {len(failures)} of {n_rows} rows failed, see {failures_file}"
    elif frac > cfg.max_failure_fraction:
        code = 1
        msg = (
            f"{n_real} of {n_rows - len(dropped)} rows failed ({frac:.0%} > max_failure_fraction="
            f"{cfg.max_failure_fraction}); see {failures_file}. The shards and manifest that were written stay in "
            f"{out_dir}."
        )
    elif n_real:
        msg = f"ok with {n_real} failed rows listed in {failures_file}"
    lines.append(msg)
    return RunResult(manifest=manifest, out_dir=out_dir, exit_code=code, message="\n".join(lines))


# the least clips of each split the trainer takes: one to train on, two to score (its caption gain compares captions)
MIN_TRAIN_CLIPS, MIN_EVAL_CLIPS = 1, 2


def with_next_steps(result: RunResult, codec_name_or_path: str, train_name: str, eval_name: str) -> RunResult:
    """The summary of a run that went well, ending with the commands that come next: check the set, train on it (the
    demo preset for a set of the demo codec, the real presets otherwise; the list quoted for any shell)."""
    if result.exit_code:
        return result
    out = shlex.quote(str(result.out_dir))
    splits = result.manifest.splits
    short = [(name, least, why) for name, least, why in (
        (train_name, MIN_TRAIN_CLIPS, "to train on"), (eval_name, MIN_EVAL_CLIPS, "for the learning check to score"),
    ) if splits[name].n_samples < least]  # fmt: skip
    if short:  # a set the trainer refuses: say so here, and hand out no training command that cannot run
        lines = [result.message]
        lines += [
            f"warning: split {name!r} has {splits[name].n_samples} clip(s), training needs at least {least} {why}: "
            f"encode more into it (a larger limit, more audio, or other split settings) before training"
            for name, least, why in short
        ]
        lines.append(f"next: python -m tokenizer_pipeline.verify {out}")
        return RunResult(result.manifest, result.out_dir, result.exit_code, "\n".join(lines))
    shards = shell_word(f"data.shards=[{hydra_value(str(result.out_dir))}]")  # Hydra's quotes, then the shell's
    for key, name, default in (("train_split", train_name, "train"), ("eval_split", eval_name, "eval")):
        if name != default:  # the trainer's split names are the defaults
            shards += f" {shell_word(f'data.{key}={hydra_value(name)}')}"
    if (Path(codec_name_or_path) / "DEMO_CODEC.md").is_file():  # the stand-in codec: only the demo models fit it
        train = f"python -m adapter_trainer +experiment=demo {shards}"
    else:
        train = f"python -m adapter_trainer +experiment=cuda_1b {shards}   (Apple silicon: +experiment=mps_small)"
    lines = [result.message, f"next: python -m tokenizer_pipeline.verify {out}", f"      {train}"]
    return RunResult(result.manifest, result.out_dir, result.exit_code, "\n".join(lines))

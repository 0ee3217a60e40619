"""The stage-1 run: MusicCaps CSV + audio (or another source) -> EnCodec code shards + manifest, on 1 or N ranks.

`run_pipeline` reads top to bottom: (1) join the ranks, check the config, plan items and shards, load the codec;
(2) rank 0 locks out_dir and prepares `.progress/`; (3) each rank (re)does its own shards; (4) rank 0 writes
failures.jsonl and manifest.json last. The set is byte-identical for any worker and rank count (same `threads`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import filelock
import torch

from ..codec.encode import CodecEncoder, resolve_batch_size
from ..config import OUTPUT_NEUTRAL_KEYS, PipelineConfig
from ..dir_lock import lock_dir
from ..errors import PipelineError, UserError
from ..shards.manifest import FORMAT_VERSION, CodecInfo, library_versions
from ..shards.write_shards import ShardPlan, plan_shards
from ..sources.plan import SourceInfo
from ..sources.splits import check_split_names
from .clip_progress import ClipProgress
from .encode_shards import encode_shard
from .finish import RunResult, with_next_steps, write_manifest
from .index_parts import save_part
from .kept import kept_shards, read_kept
from .loader import DecodedClip, decoded_clips
from .planning import PlanItem, check_audio_dir, check_out_dir, load_plan, source_sha256
from .progress import LOCK_FILE, ProgressStore, musiccaps_fingerprint, why_redo
from .ranks import RankInfo, agree, check_shared_out_dir, join_ranks
from .segment_items import segmentation_summary, source_summary

__all__ = ["EXPLAIN", "RunResult", "RunStopped", "run_pipeline"]

EXPLAIN = """\
tokenizer_pipeline needs audio: set audio_dir (nothing is downloaded at run time).

Real MusicCaps audio
  One file per CSV row named {ytid}.<ext> (wav, flac, mp3, ogg, m4a, opus, webm), already cut to the
  row's [start_s, end_s] window. `make audio OUT=/path/to/musiccaps_audio` downloads them that way
  (python -m tokenizer_pipeline.download out_dir=...; yt-dlp + an ffmpeg program). Then:
      make shards DATA=/path/to/musiccaps_audio [OUT=build/shards]
      python -m tokenizer_pipeline audio_dir=/path/to/musiccaps_audio out_dir=build/shards
  Full-length source audio instead of 10-s cuts: add crop_to_window=true.
  Missing/unreadable clips are recorded in <out_dir>/failures.jsonl, not fatal; rerun the same
  command after fetching or fixing audio: only the shards whose audio changed are redone.
  N GPUs: torchrun --nproc_per_node=N -m tokenizer_pipeline audio_dir=... out_dir=...

Your own audio instead (full-length tracks, cut into 10-s segments; README, "Your own audio")
      python -m tokenizer_pipeline source=audiocraft source.manifest=egs/mine/data.jsonl out_dir=build/mine
      python -m tokenizer_pipeline source=audiofolder source.dir=/path/to/folder out_dir=build/mine

Offline stand-in (no downloads): a synthetic corpus + a small demo codec
      make demo-shards        (= make corpus codec, then +preset=demo for the stand-in clips)
      make demo               (also trains the adapter on those shards)
"""


EXPLAIN_HINT = "how to get them: python -m tokenizer_pipeline --explain"


class RunStopped(Exception):
    """Ctrl-C or SIGTERM stopped the run: the clip in flight was dropped, `kept` of this rank's `total` shards are
    complete in `out_dir` (records saved, the lock released); the same command encodes only the rest (or, every shard
    complete, writes the manifest)."""

    def __init__(self, kept: int, total: int, out_dir: Path) -> None:
        super().__init__(f"{kept} of {total} shards complete in {out_dir}")
        self.kept, self.total, self.out_dir = kept, total, out_dir


def codec_path_from_set(name_or_path: str, out_dir: Path) -> str | None:
    """The codec directory relative to the shard set (so decode finds it from any working directory, and after the
    set and its codec are copied side by side); None for a hub id."""
    p = Path(name_or_path).expanduser()
    if not p.is_dir():
        return None
    return Path(os.path.relpath(p.resolve(), out_dir.resolve())).as_posix()


def load_encoder(cfg: PipelineConfig) -> CodecEncoder:
    try:
        return CodecEncoder(
            cfg.codec.name_or_path, device=cfg.codec.device, dtype=cfg.codec.dtype,
            bandwidth_kbps=cfg.codec.bandwidth_kbps, pad_batches=cfg.codec.pad_batches,
        )  # fmt: skip
    except (OSError, ValueError) as e:
        raise PipelineError(f"codec {cfg.codec.name_or_path!r}: {e}") from e


def check_config(cfg: PipelineConfig) -> None:
    """Values no run can use; a UserError names the key and the allowed range. Runs before anything is read or
    written, for every source (split names become directories of out_dir): the audio_dir of MusicCaps is a
    directory, out_dir can be created and written."""
    check_split_names(cfg.split.train_name, cfg.split.eval_name)
    if cfg.source.kind == "musiccaps" and not (cfg.audio_dir and Path(cfg.audio_dir).is_dir()):
        raise PipelineError(
            f"audio_dir={cfg.audio_dir} is not a directory; point audio_dir at the folder of {{ytid}}.<ext> clips "
            f"({EXPLAIN_HINT})"
        )
    check_out_dir(cfg.out_dir)
    resolve_batch_size(cfg.codec.batch_size, "cpu")  # an int >= 1 or auto
    for key, value, low in (("workers", cfg.workers, 0), ("prefetch", cfg.prefetch, 1),
                            ("threads", cfg.threads, 1)):  # fmt: skip
        if value is not None and value < low:
            raise PipelineError(f"{key}={value} must be >= {low}")


def default_workers(ranks: RankInfo) -> int:
    """CPU cores this process may use, shared among the ranks on this node (at least 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // ranks.local_world_size)


def lock_out_dir(out_dir: Path) -> filelock.BaseFileLock:
    """An exclusive lock on `out_dir/.lock` so two runs cannot write one shard set (released on exit)."""
    return lock_dir(out_dir, LOCK_FILE, "tokenizer_pipeline run", PipelineError)


def run_pipeline(cfg: PipelineConfig, *, progress: bool = True) -> RunResult:
    """Run stage 1 end to end (one process, or this rank of a torchrun job); PipelineError for a configuration
    problem (codec, out_dir, CSV, lock) found before anything is encoded."""
    threads_before = torch.get_num_threads()  # cfg.threads is this run's setting, not the caller's process-wide one
    try:
        return _run_pipeline(cfg, progress)
    finally:
        torch.set_num_threads(threads_before)


def _run_pipeline(cfg: PipelineConfig, progress: bool) -> RunResult:
    # 1. ranks, configuration, plan and codec: problems stop every rank here
    ranks = join_ranks(cfg.codec.device)
    items, source_info, plans, encoder = _setup_plan_and_codec(cfg, ranks)
    # auto -> this device's number; from here on (and in the manifest's config) the batch size is that int
    cfg = replace(
        cfg, codec=replace(cfg.codec, batch_size=resolve_batch_size(cfg.codec.batch_size, encoder.device_type))
    )
    threads = torch.get_num_threads()  # a recorded setting: codes are reproducible only with the same count
    codec_info = _codec_info(cfg, encoder, threads)
    csv_sha = source_sha256(cfg, source_info)
    resolved = {k: v for k, v in asdict(cfg).items() if k not in OUTPUT_NEUTRAL_KEYS} | {"threads": threads}
    fingerprint = _fingerprint(codec_info, encoder, csv_sha, resolved, source_info)

    # 2. rank 0 locks out_dir and prepares .progress/ (a different config is refused unless overwrite)
    store = ProgressStore(Path(cfg.out_dir))
    lock = _setup_out_dir(cfg, ranks, store, fingerprint)
    owned, saved = ranks.owned(plans), []  # saved: the shards this run finished (appended as each is kept)
    todo: list[ShardPlan] | None = None

    def kept() -> int:  # this rank's complete shards (before the plan of what to redo exists: read from disk)
        if todo is None:
            return sum(store.completed(p) is not None for p in owned)
        return len(owned) - len(todo) + len(saved)

    try:
        # 3. this rank's shards that need work (new, damaged, or inputs changed), encoded in plan order
        todo = [p for p in owned if why_redo(store, p, cfg) is not None]
        workers = default_workers(ranks) if cfg.workers is None else cfg.workers
        try:
            audio_s, elapsed = _encode_shards(cfg, ranks, todo, store, encoder, workers, progress, saved)
        except OSError as e:  # a full disk or a failed write: nothing half-written stays, the finished shards do
            if e.errno is None:
                raise
            raise PipelineError(_write_failed(e, store.out_dir, kept(), len(owned), cfg.overwrite)) from None

        # 4. all ranks done; rank 0 assembles failures.jsonl and the manifest from every shard's record
        audio_s = _sum_over_ranks(ranks, audio_s)
        result = None
        if ranks.is_main:
            try:
                result = write_manifest(
                    cfg, plans, store, codec_info, source_summary(cfg, source_info, csv_sha),
                    segmentation_summary(source_info), resolved, len(items),
                    dropped=[] if source_info is None else source_info.dropped,
                )  # fmt: skip
            except OSError as e:  # the indexes, failures.jsonl or the manifest: each written whole or not at all
                if e.errno is None:
                    raise
                raise PipelineError(_write_failed(e, store.out_dir, len(plans), len(plans), cfg.overwrite)) from None
            result = with_next_steps(
                _with_speed_line(result, elapsed, audio_s, len(todo), ranks), cfg.codec.name_or_path,
                cfg.split.train_name, cfg.split.eval_name,
            )  # fmt: skip
        return _share_result(ranks, result)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (__main__ makes it one): the decode workers are closed by now
        raise RunStopped(kept(), len(owned), store.out_dir) from None
    finally:
        if lock is not None:
            lock.release()


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _write_failed(e: OSError, out_dir: Path, kept: int, total: int, overwrite: bool) -> str:
    """One line for a write into out_dir that failed: the directory, that it is full (or why it failed), the fix."""
    where = f" (writing {e.filename})" if e.filename else ""
    what = (
        f"the filesystem of {out_dir} is full ({e.strerror}){where}"
        if e.errno in DISK_FULL
        else f"a write into {out_dir} failed: {e.strerror}{where}"
    )
    fix = f"free space there (df -h {shlex.quote(str(out_dir))})" if e.errno in DISK_FULL else "fix that"
    again = "the same command without overwrite=true" if overwrite else "the same command"
    return (
        f"{what}; {kept} of {total} shards are complete and kept (nothing half-written is). {fix[0].upper()}"
        f"{fix[1:]}, then rerun {again}: it encodes only the rest"
    )


def _setup_plan_and_codec(
    cfg: PipelineConfig, ranks: RankInfo
) -> tuple[list[PlanItem], SourceInfo | None, list[ShardPlan], CodecEncoder]:
    """Check the config, plan items and shards, load the codec; a PipelineError on any rank stops every rank."""
    error, items, source_info, plans, encoder = None, [], None, [], None
    try:
        check_config(cfg)
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        kept = read_kept(cfg)  # your own audio encoded again into out_dir: its root, splits and shards stay
        items, source_info = load_plan(cfg, kept)
        if source_info is None:  # MusicCaps: some row's clip must be there, or nothing could be encoded
            check_audio_dir(cfg, items, EXPLAIN_HINT)
        split_names = [cfg.split.train_name, cfg.split.eval_name]
        plans = (
            plan_shards(items, split_names, cfg.shard.max_samples)
            if kept is None
            else kept_shards(items, split_names, cfg.shard.max_samples, kept)
        )
        encoder = load_encoder(cfg)
    except UserError as e:  # PipelineError, ConfigError, SourceError: one line, every rank stops
        error = str(e)
    agree(ranks, error)
    assert encoder is not None
    return items, source_info, plans, encoder


def _codec_info(cfg: PipelineConfig, encoder: CodecEncoder, threads: int) -> CodecInfo:
    """The manifest's record of the codec that made the codes (and the settings its floats depend on)."""
    same = ("sampling_rate", "frame_rate", "n_codebooks", "codebook_size", "bandwidth_kbps", "weights_sha256", "dtype")
    return CodecInfo(
        **{name: getattr(encoder, name) for name in same},
        name_or_path=cfg.codec.name_or_path,
        model_class=type(encoder.model).__name__,
        library_versions=library_versions(),
        device=encoder.device_type,
        num_threads=threads,
        config=encoder.config_identity,
        path_from_set=codec_path_from_set(cfg.codec.name_or_path, Path(cfg.out_dir)),
    )


def _fingerprint(
    codec_info: CodecInfo, encoder: CodecEncoder, csv_sha: str, resolved: dict, source_info: SourceInfo | None
) -> dict:
    """What must match for a rerun to resume `out_dir` (`.progress/config.json`). For your own audio, the sha256 of
    its manifest or metadata (MusicCaps: of the CSV, csv_sha256) and the id root are left out: a grown, shrunk or
    re-captioned collection resumes and redoes only the shards whose tracks changed (kept.py); the root used is
    recorded as `source_root` for the next run to keep (progress.RECORDED_ONLY)."""
    fingerprint = {
        "format_version": FORMAT_VERSION,
        "codec": asdict(codec_info) | {"library_versions": None, "path_from_set": None},
        "device": encoder.device.type,
        "csv_sha256": csv_sha,  # the CSV's sha256 (MusicCaps)
        "config": resolved | {"overwrite": None, "max_failure_fraction": None, "out_dir": None},
    }
    if source_info is None:
        return musiccaps_fingerprint(fingerprint)
    fingerprint.pop("csv_sha256")
    fingerprint["config"] = fingerprint["config"] | {"source": fingerprint["config"]["source"] | {"root": None}}
    if source_info.root is not None:  # the id root used, whether set, kept or found
        fingerprint["source_root"] = source_info.root
    return fingerprint


def _setup_out_dir(
    cfg: PipelineConfig, ranks: RankInfo, store: ProgressStore, fingerprint: dict
) -> filelock.BaseFileLock | None:
    """Rank 0 locks out_dir and prepares `.progress/`; a refusal on rank 0 stops every rank. Returns rank 0's lock."""
    lock, error = None, None
    if ranks.is_main:
        try:
            lock = lock_out_dir(store.out_dir)
            split_names = [cfg.split.train_name, cfg.split.eval_name]
            store.prepare(fingerprint, split_names, cfg.overwrite)
        except PipelineError as e:
            error = str(e)
            if lock is not None:
                lock.release()
    agree(ranks, error)
    try:
        check_shared_out_dir(ranks, store.dir, what="out_dir", where=store.out_dir)
    except PipelineError:
        if lock is not None:
            lock.release()
        raise
    return lock


def _encode_shards(
    cfg: PipelineConfig, ranks: RankInfo, todo: list[ShardPlan], store: ProgressStore, encoder: CodecEncoder,
    workers: int, progress: bool, saved: list[ShardPlan],
) -> tuple[float, float]:  # fmt: skip
    """Decode (worker processes) and encode (this process) the shards in `todo`, saving each one's record (and
    appending it to `saved`). Returns (audio seconds encoded, elapsed seconds)."""
    t0 = time.monotonic()
    audio_s = 0.0
    todo_rows = [r for p in todo for r in p.rows]
    desc = f"encode (rank {ranks.rank}/{ranks.world_size})" if ranks.world_size > 1 else "encode"
    shown = ClipProgress(len(todo_rows), desc, show=progress and ranks.rank == 0)
    with contextlib.closing(decoded_clips(todo_rows, cfg, encoder.sampling_rate, workers)) as decoded:
        # the decode workers end with this block, whichever way it is left
        clips = _counted(decoded, shown, encoder.sampling_rate)
        try:
            for plan in todo:
                rec = encode_shard(plan, clips, encoder, cfg, store.out_dir)
                store.save(plan, rec)
                saved.append(plan)
                # this shard's part of its split's index, while its tar is in the page cache (rank 0 assembles them)
                save_part(store.out_dir, store.dir, rec.entry, encoder.n_codebooks, encoder.codebook_size)
                audio_s += rec.audio_seconds
        finally:
            shown.close()
    return audio_s, time.monotonic() - t0


def _counted(clips: Iterator[DecodedClip], shown: ClipProgress, sampling_rate: int) -> Iterator[DecodedClip]:
    """`clips`, counting each one the encoder takes (its audio seconds: 0 for a failed clip) on `shown`."""
    for clip in clips:
        shown.update(0.0 if clip.wav is None else int(clip.wav.shape[-1]) / sampling_rate)
        yield clip


def _sum_over_ranks(ranks: RankInfo, audio_s: float) -> float:
    if ranks.world_size == 1:
        return audio_s
    import torch.distributed as dist

    rates: list[float] = [0.0] * ranks.world_size
    dist.all_gather_object(rates, audio_s)
    return sum(rates)


def _with_speed_line(result: RunResult, elapsed: float, audio_s: float, n_redone: int, ranks: RankInfo) -> RunResult:
    """The summary with this run's speed inserted above its last (status) line."""
    lines = result.message.splitlines()
    lines.insert(
        -1,
        f"  {elapsed:.1f} s, {audio_s / max(elapsed, 1e-9):.1f} audio-s/s this run "
        f"({n_redone} shards redone on rank 0, {ranks.world_size} rank(s); skipped shards excluded)",
    )
    return RunResult(result.manifest, result.out_dir, result.exit_code, "\n".join(lines))


def _share_result(ranks: RankInfo, result: RunResult | None) -> RunResult:
    """Rank 0's result on every rank; then the ranks leave the process group together."""
    if ranks.world_size > 1:
        import torch.distributed as dist

        box = [result]
        dist.broadcast_object_list(box, src=0)
        result = box[0]
        # No rank tears the group down while another still receives rank 0's result (else the job can abort on exit).
        dist.barrier()
        dist.destroy_process_group()
    assert result is not None
    return result

"""The stage-1 run: MusicCaps CSV + audio (or another source) -> EnCodec code shards + manifest, on 1 or N ranks.

`run_pipeline` reads top to bottom:
  1. join the torchrun group when there is one (gloo on CPU, nccl with one GPU per rank); check the
     configuration, read the CSV (or plan the segments of source=audiocraft|audiofolder: sources/), plan every
     shard, load the codec. Anything a user must fix stops every
     rank here, before any encoding, as a `PipelineError` whose message names the fix
  2. rank 0 locks `out_dir` and prepares `.progress/` (a different config is refused unless overwrite)
  3. this rank owns a contiguous range of the shards and (re)does the ones that are new, damaged, or
     whose audio appeared or changed: DataLoader worker processes decode + resample while this process
     encodes batches of equal-length clips and writes each tar; one bad clip is one `FailureRecord`
  4. all ranks done; rank 0 writes failures.jsonl and manifest.json (last) from the `.progress/` records

The set is byte-identical for any worker count and any number of ranks (same per-process `threads`):
a clip's shard and its batch companions depend only on the plan, never on timing.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path

import filelock
import numpy as np
import torch
from tqdm import tqdm

from .config import OUTPUT_NEUTRAL_KEYS, PipelineConfig
from .dir_lock import lock_dir
from .encode import CodecEncoder, resolve_batch_size
from .errors import ConfigError
from .ffmpeg_binary import FFmpegNotFoundError, find_ffmpeg
from .manifest import (
    FORMAT_VERSION,
    CodecInfo,
    FailureRecord,
    Manifest,
    SampleRecord,
    SegmentSampleRecord,
    SplitSummary,
    library_versions,
    write_failures_jsonl,
    write_text_atomic,
)
from .musiccaps import ClipRow, CsvRowError, read_musiccaps_csv
from .read_audio import FFMPEG_FIX, ClipFailure, load_audio
from .segment_items import (
    decode_segment,
    segment_failure,
    segment_identity,
    segment_sample_record,
    segmentation_summary,
    source_summary,
    why_redo_segments,
)
from .sources import SegmentItem, SourceError, SourceInfo, plan_items
from .write_shards import (
    LOCK_FILE,
    PipelineError,
    ProgressStore,
    ShardPlan,
    ShardRecord,
    ShardTarWriter,
    check_keys,
    plan_shards,
    sha256_file,
)

# A rank that finished its shards waits at the final barrier for the slowest rank (and rank 0 for the
# others while it hashes a large set): long enough for a full MusicCaps pass on one slow GPU.
DIST_TIMEOUT = timedelta(hours=12)

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
      make demo-shards        (= make corpus codec, then python -m tokenizer_pipeline +preset=demo)
      make demo               (also trains the adapter on those shards)
"""


# A planned unit of work: a MusicCaps CSV row (one clip), or a segment (or track-level failure) of another source.
PlanItem = ClipRow | SegmentItem


@dataclass(frozen=True)
class RunResult:
    manifest: Manifest
    out_dir: Path
    exit_code: int  # 0 ok; 1 nothing encoded or too many failures
    message: str


# ---------------------------------------------------------------------------------------------- ranks


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in a torchrun job (a single process is rank 0 of 1); adapter_trainer names it alike."""

    rank: int
    world_size: int
    local_rank: int  # GPU index on this node
    local_world_size: int  # ranks on this node (they share its CPU cores)

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes the manifest and prints the summary."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def owned(self, plans: list[ShardPlan]) -> list[ShardPlan]:
        """A contiguous, deterministic range of the plan: rank r gets plans[n*r//W : n*(r+1)//W]."""
        n = len(plans)
        return plans[n * self.rank // self.world_size : n * (self.rank + 1) // self.world_size]


def join_ranks(codec_device: str) -> RankInfo:
    """Read torchrun's environment; with WORLD_SIZE > 1 join the process group (nccl on GPUs, else gloo)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return RankInfo(0, 1, 0, 1)
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    on_gpu = codec_device in ("auto", "cuda") and torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(local_rank)  # codec.device "cuda"/"auto" then means cuda:LOCAL_RANK
    if not dist.is_initialized():
        dist.init_process_group("nccl" if on_gpu else "gloo", timeout=DIST_TIMEOUT)
    return RankInfo(dist.get_rank(), dist.get_world_size(), local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", world)))


def agree(ranks: RankInfo, error: str | None) -> None:
    """Every rank raises PipelineError if any rank had `error` (so none waits forever at a barrier).

    Under torchrun the ranks then leave the process group together (a barrier, then destroy it): a rank that
    exited with the group still up aborted ("terminate called without an active exception", SIGABRT in
    torchrun's report) instead of exiting 2 with the one `error:` line.
    """
    if ranks.is_distributed:
        import torch.distributed as dist

        errors: list[str | None] = [None] * ranks.world_size
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), None)
        if error:
            dist.barrier()
            dist.destroy_process_group()
    if error:
        raise PipelineError(error)


# ------------------------------------------------------------------------------------- decode workers


def find_audio(audio_dir: Path, ytid: str, exts: list[str]) -> Path:
    """First existing `{audio_dir}/{ytid}.{ext}` in `exts` order; ClipFailure("missing_audio") if none."""
    for ext in exts:
        p = audio_dir / f"{ytid}.{ext.lstrip('.')}"
        if p.is_file():
            return p
    raise ClipFailure(
        "missing_audio", audio_dir / f"{ytid}.*", f"audio file not found: no {ytid}.{{{','.join(exts)}}} in {audio_dir}"
    )


def clip_failure(row: PlanItem, err: Exception, stage: str, path: Path | str | None = None) -> FailureRecord:
    """A typed failure: `ClipFailure`s keep their reason (read_audio.REASONS); any other exception while
    decoding or encoding this clip becomes `decode_error` / `encode_error` with its type and message.
    A segment's failure names its source file and time range in `detail`."""
    if not isinstance(err, ClipFailure):
        err = ClipFailure.from_exception(f"{stage}_error", path if path is not None else f"{row.ytid}.*", err)
    if isinstance(row, SegmentItem):
        return segment_failure(row, err)
    return FailureRecord(ytid=row.ytid, csv_row=row.csv_row, split=row.split, **err.record_fields())


@dataclass(frozen=True)
class DecodedClip:
    """One row after the decode worker: audio ready for the encoder, or the reason it is not."""

    row: PlanItem
    wav: torch.Tensor | None  # [N] float32 mono at the codec's rate; None when it failed
    source_file: str | None  # relative to audio_dir; None when no file exists
    source_sha256: str | None
    failure: FailureRecord | None


class ClipSource(torch.utils.data.Dataset):
    """Row i -> DecodedClip: find, hash, decode, resample. Runs in DataLoader worker processes."""

    def __init__(self, rows: list[PlanItem], cfg: PipelineConfig, sampling_rate: int) -> None:
        self.rows, self.cfg, self.sampling_rate = rows, cfg, sampling_rate
        self.audio_dir = Path(cfg.audio_dir or "")  # musiccaps only; segments name their files

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> DecodedClip:
        if isinstance(self.rows[i], SegmentItem):
            return self._segment(self.rows[i])
        row, rel, sha, src = self.rows[i], None, None, None
        try:
            src = find_audio(self.audio_dir, row.ytid, self.cfg.audio_ext)
            rel, sha = src.relative_to(self.audio_dir).as_posix(), sha256_file(src)
            wav = load_audio(
                src, self.sampling_rate, start_s=row.start_s, end_s=row.end_s, crop_to_window=self.cfg.crop_to_window,
                duration_tolerance_s=self.cfg.duration_tolerance_s, min_seconds=self.cfg.min_seconds,
            )  # [N]  # fmt: skip
        except Exception as e:  # per-clip isolation: whatever breaks on this one file is recorded for it, not raised
            return DecodedClip(row, None, rel, sha, clip_failure(row, e, "decode", src))
        return DecodedClip(row, wav, rel, sha, None)

    def _segment(self, item: SegmentItem) -> DecodedClip:
        wav, rel, sha, failure = decode_segment(item, self.sampling_rate, self.cfg.duration_tolerance_s)  # [N]
        return DecodedClip(item, wav, rel, sha, failure)


def _worker_init(_: int) -> None:
    torch.set_num_threads(1)  # one core per decode worker; the encoder owns the intra-op threads


def _as_is(clip: DecodedClip) -> DecodedClip:
    return clip


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Decode in the main process with one thread, as a worker would (same floats for any worker count)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def decoded_clips(rows: list[PlanItem], cfg: PipelineConfig, sampling_rate: int, workers: int) -> Iterator[DecodedClip]:
    """DecodedClips in `rows` order. workers > 0: that many processes, at most `prefetch` clips ahead each."""
    source = ClipSource(rows, cfg, sampling_rate)
    if workers == 0:
        for i in range(len(source)):
            with _one_thread():
                clip = source[i]
            yield clip
        return
    loader = torch.utils.data.DataLoader(
        source, batch_size=None, shuffle=False, num_workers=workers, prefetch_factor=cfg.prefetch,
        collate_fn=_as_is, worker_init_fn=_worker_init,  # yields in index order (in_order defaults to True)
    )  # fmt: skip
    yield from loader


# ------------------------------------------------------------------------------------------- encoding


@dataclass(frozen=True)
class EncodedClip:
    row: PlanItem
    codes: np.ndarray  # [T, K] int16
    n_samples: int  # audio samples at the codec's rate
    source_file: str
    source_sha256: str


class LengthBuckets:
    """Collects decoded clips into batches of equal length (MusicCaps windows are all 10 s).

    `add` returns the batches that are ready: a bucket that reached `batch_size`, or every bucket
    once `max_pending` clips wait (odd lengths never pile up a whole shard of audio). Which clips
    share a batch depends only on the order of `add` calls, so the codes never depend on timing.
    """

    def __init__(self, batch_size: int, same_length: bool) -> None:
        self.batch_size, self.same_length = batch_size, same_length
        self.max_pending = 2 * batch_size
        self.buckets: dict[int, list[DecodedClip]] = {}

    def add(self, clip: DecodedClip) -> list[list[DecodedClip]]:
        assert clip.wav is not None
        key = int(clip.wav.shape[-1]) if self.same_length else 0
        bucket = self.buckets.setdefault(key, [])
        bucket.append(clip)
        if len(bucket) == self.batch_size:
            return [self.buckets.pop(key)]
        if sum(len(b) for b in self.buckets.values()) >= self.max_pending:
            return self.drain()
        return []

    def drain(self) -> list[list[DecodedClip]]:
        batches = list(self.buckets.values())
        self.buckets = {}
        return batches


def encode_isolated(encoder: CodecEncoder, clips: list[DecodedClip]) -> list[np.ndarray | FailureRecord]:
    """Codes ([T, K] int16) per clip; if the batch's forward fails, each clip is retried alone so only a bad one fails."""
    try:
        return list(encoder.encode_batch([c.wav for c in clips]))  # each [N] -> [T, K]
    except Exception as e:  # per-clip isolation (OOM, a kernel error on one input, ...): recorded below
        if len(clips) == 1:
            return [clip_failure(clips[0].row, e, "encode", clips[0].source_file)]
        return [encode_isolated(encoder, [c])[0] for c in clips]


def sample_record(clip: EncodedClip, sampling_rate: int) -> SampleRecord | SegmentSampleRecord:
    row = clip.row
    if isinstance(row, SegmentItem):
        return segment_sample_record(
            row, clip.codes, clip.n_samples, clip.source_file, clip.source_sha256, sampling_rate
        )
    return SampleRecord(
        ytid=row.ytid,
        start_s=row.start_s,
        end_s=row.end_s,
        audioset_positive_labels=list(row.audioset_positive_labels),
        aspect_list=list(row.aspect_list),
        caption=row.caption,
        author_id=row.author_id,
        is_balanced_subset=row.is_balanced_subset,
        is_audioset_eval=row.is_audioset_eval,
        split=row.split,
        csv_row=row.csv_row,
        n_frames=int(clip.codes.shape[0]),
        n_codebooks=int(clip.codes.shape[1]),
        duration_s=clip.n_samples / sampling_rate,
        source_file=clip.source_file,
        source_sha256=clip.source_sha256,
    )


def encode_shard(
    plan: ShardPlan, clips: Iterator[DecodedClip], encoder: CodecEncoder, cfg: PipelineConfig, out_dir: Path
) -> ShardRecord:
    """Take the shard's rows from `clips` (in plan order), encode them in equal-length batches, write the tar.

    Memory: at most `2 x batch_size` decoded clips plus the shard's codes (~1 MB per 256 clips).
    """
    done: dict[str, EncodedClip | FailureRecord] = {}
    inputs: dict[str, list[str | None]] = {}
    buckets = LengthBuckets(cfg.codec.batch_size, same_length=not cfg.codec.pad_batches)

    def encode(batch: list[DecodedClip]) -> None:
        for clip, out in zip(batch, encode_isolated(encoder, batch)):
            if isinstance(out, FailureRecord):
                done[clip.row.ytid] = out
            else:  # keep the codes, drop the audio
                assert clip.wav is not None and clip.source_file and clip.source_sha256
                done[clip.row.ytid] = EncodedClip(
                    clip.row, out, int(clip.wav.shape[-1]), clip.source_file, clip.source_sha256
                )

    for row in plan.rows:
        clip = next(clips)
        if clip.row != row:
            raise RuntimeError(f"decode order broke: expected row {row.csv_row}, got {clip.row.csv_row}")
        inputs[row.ytid] = (
            segment_identity(row, clip.source_file, clip.source_sha256)
            if isinstance(row, SegmentItem)
            else [clip.source_file, clip.source_sha256]
        )
        if clip.failure is not None:
            done[row.ytid] = clip.failure
            continue
        for batch in buckets.add(clip):
            encode(batch)
    for batch in buckets.drain():
        encode(batch)

    failures: list[FailureRecord] = []
    audio_s, n_frames = 0.0, 0
    with ShardTarWriter(out_dir, plan) as writer:
        for row in plan.rows:  # CSV order, whatever order the batches finished in
            out = done[row.ytid]
            if isinstance(out, FailureRecord):
                failures.append(out)
                continue
            rec = sample_record(out, encoder.sampling_rate)
            writer.write(rec, out.codes)
            audio_s += rec.duration_s
            n_frames += rec.n_frames
        entry = writer.commit()
    return ShardRecord(entry=entry, audio_seconds=audio_s, n_frames=n_frames, failures=failures, inputs=inputs)


# --------------------------------------------------------------------------------------------- resume


@functools.lru_cache(maxsize=1)
def ffmpeg_available() -> bool:
    """Whether FFmpeg formats can be decoded here: an ffmpeg program (the system's, or the imageio-ffmpeg wheel's;
    read_audio falls back to it), or torchcodec with the FFmpeg libraries (probed by decoding a 10-ms wav)."""
    try:
        find_ffmpeg()
        return True
    except FFmpegNotFoundError:
        pass
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.zeros(160, np.float32), 16000, format="WAV")
    try:
        from torchcodec.decoders import AudioDecoder

        AudioDecoder(buf.getvalue())
    except Exception:  # ImportError, or torchcodec's RuntimeError listing the FFmpeg versions it tried
        return False
    return True


def why_redo(store: ProgressStore, plan: ShardPlan, cfg: PipelineConfig) -> str | None:
    """Why this shard must be (re)encoded, or None when its tar and inputs are unchanged.

    Redone: no record or a damaged tar; a retryable failure (`FailureRecord.retryable`: an encode error or
    running out of memory, at once; a missing file once it exists; an FFmpeg failure once FFmpeg is installed);
    a row whose audio file changed (another file or other bytes). Final failures (corrupt audio, too short, ...)
    are redone only when their file changes. Audio deleted after encoding keeps its sample (deleting sources
    never deletes shards).
    """
    rec = store.completed(plan)
    if rec is None:
        return "new or damaged"
    if set(rec.inputs) != {row.ytid for row in plan.rows}:
        return "its planned samples changed (a track's segments or failure changed)"
    if cfg.source.kind != "musiccaps":
        return why_redo_segments(rec, plan)
    audio_dir = Path(cfg.audio_dir or "")
    for f in rec.failures:
        if f.retryable and f.reason not in ("missing_audio", "needs_ffmpeg"):  # those two: only once the cause went
            return f"{f.ytid} failed with a retryable {f.reason}"
    ffmpeg_failed = {f.ytid for f in rec.failures if f.reason == "needs_ffmpeg"}
    for row in plan.rows:
        try:
            src = find_audio(audio_dir, row.ytid, cfg.audio_ext)
        except ClipFailure:  # still missing
            continue
        old_file, old_sha = rec.inputs.get(row.ytid, [None, None])
        if src.relative_to(audio_dir).as_posix() != old_file or sha256_file(src) != old_sha:
            return f"audio of {row.ytid} appeared or changed"
        if row.ytid in ffmpeg_failed and ffmpeg_available():
            return f"{row.ytid} needed FFmpeg, which is now installed"
    return None


# -------------------------------------------------------------------------------------------- the run


def load_rows(cfg: PipelineConfig) -> list[ClipRow]:
    """CSV rows in file order (first `limit`), keys checked. Malformed rows stop the run up front, naming the line."""
    csv_path = Path(cfg.csv)
    try:
        rows = list(read_musiccaps_csv(
            csv_path, train_name=cfg.split.train_name, eval_name=cfg.split.eval_name, eval_column=cfg.split.eval_column
        ))  # fmt: skip
    except CsvRowError as e:
        raise PipelineError(
            f"{e}\nFix or delete that CSV row (the whole CSV is checked before any audio is read)."
        ) from e
    except (FileNotFoundError, ValueError, UnicodeDecodeError) as e:
        raise PipelineError(str(e)) from e
    rows = rows if cfg.limit is None else rows[: cfg.limit]
    check_keys(rows, csv_path)
    return rows


def load_plan(cfg: PipelineConfig) -> tuple[list[PlanItem], SourceInfo | None]:
    """The run's planned items in source order: CSV rows (musiccaps) or segments (sources/plan.py), keys checked."""
    if cfg.source.kind == "musiccaps":
        return list(load_rows(cfg)), None
    try:
        items, info = plan_items(cfg)
    except (SourceError, ConfigError) as e:
        raise PipelineError(str(e)) from e
    check_keys(items, Path(info.path))  # the key rule holds by construction (track_ids.py); checked all the same
    return list(items), info


def source_sha256(cfg: PipelineConfig, info: SourceInfo | None) -> str:
    """sha256 of the CSV, the audiocraft manifest, or the audiofolder metadata (in the fingerprint and manifest)."""
    return sha256_file(Path(cfg.csv)) if info is None else info.sha256


MUSICCAPS_FINGERPRINT_VERSION = 2  # MusicCaps tars and progress records are unchanged since format version 2


def musiccaps_fingerprint(fingerprint: dict) -> dict:
    """A MusicCaps run's fingerprint as format version 2 wrote it: without the own-audio settings (source.*, segment.*,
    split.eval_fraction, unused by MusicCaps), so a set written before format 3 resumes and heals."""
    config = {k: v for k, v in fingerprint["config"].items() if k not in ("source", "segment")}
    config["split"] = {k: v for k, v in config["split"].items() if k != "eval_fraction"}
    return fingerprint | {"format_version": MUSICCAPS_FINGERPRINT_VERSION, "config": config}


def source_change_words(info: SourceInfo | None) -> dict[str, str] | None:
    """How a refused resume names a changed source file of your own audio (its sha256 is the fingerprint's
    csv_sha256, a name kept so existing MusicCaps sets resume)."""
    if info is None:
        return None
    what = {"audiocraft": "audiocraft manifest", "audiofolder": "audiofolder metadata file(s) in"}[info.kind]
    return {"csv_sha256": f"the {what} {info.path} changed since these shards were written"}


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
    """Values no run can use; PipelineError names the key and the allowed range."""
    if cfg.source.kind == "musiccaps" and not (cfg.audio_dir and Path(cfg.audio_dir).is_dir()):
        raise PipelineError(f"audio_dir {cfg.audio_dir} is not a directory.\n\n{EXPLAIN}")
    try:
        resolve_batch_size(cfg.codec.batch_size, "cpu")  # an int >= 1 or auto
    except ValueError as e:  # ConfigError
        raise PipelineError(str(e)) from e
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
    """Run stage 1 end to end (one process, or this rank of a torchrun job).

    Raises:
        PipelineError: a configuration problem (codec, out_dir, CSV, lock) found before anything is encoded.
    """
    threads_before = torch.get_num_threads()  # cfg.threads is this run's setting, not the caller's process-wide one
    try:
        return _run_pipeline(cfg, progress)
    finally:
        torch.set_num_threads(threads_before)


def _run_pipeline(cfg: PipelineConfig, progress: bool) -> RunResult:
    out_dir = Path(cfg.out_dir)

    # 1. ranks, configuration, CSV, plan and codec: problems stop every rank here
    ranks = join_ranks(cfg.codec.device)
    error, plans, encoder, source_info = None, [], None, None
    try:
        check_config(cfg)
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        rows, source_info = load_plan(cfg)
        split_names = [cfg.split.train_name, cfg.split.eval_name]
        plans = plan_shards(rows, split_names, cfg.shard.max_samples)
        encoder = load_encoder(cfg)
    except PipelineError as e:
        error = str(e)
    agree(ranks, error)
    assert encoder is not None
    # auto -> this device's number; from here on (and in the manifest's config) the batch size is that int
    cfg = replace(
        cfg, codec=replace(cfg.codec, batch_size=resolve_batch_size(cfg.codec.batch_size, encoder.device_type))
    )
    threads = torch.get_num_threads()  # a recorded setting: codes are reproducible only with the same count
    workers = default_workers(ranks) if cfg.workers is None else cfg.workers

    codec_info = CodecInfo(
        name_or_path=cfg.codec.name_or_path,
        model_class=type(encoder.model).__name__,
        sampling_rate=encoder.sampling_rate,
        frame_rate=encoder.frame_rate,
        n_codebooks=encoder.n_codebooks,
        codebook_size=encoder.codebook_size,
        bandwidth_kbps=encoder.bandwidth_kbps,
        weights_sha256=encoder.weights_sha256,
        dtype=encoder.dtype,
        library_versions=library_versions(),
        device=encoder.device_type,
        num_threads=threads,
        config=encoder.config_identity,
        path_from_set=codec_path_from_set(cfg.codec.name_or_path, out_dir),
    )
    csv_sha = source_sha256(cfg, source_info)
    resolved = {k: v for k, v in asdict(cfg).items() if k not in OUTPUT_NEUTRAL_KEYS} | {"threads": threads}
    fingerprint = {
        "format_version": FORMAT_VERSION,
        "codec": asdict(codec_info) | {"library_versions": None, "path_from_set": None},
        "device": encoder.device.type,
        "csv_sha256": csv_sha,  # the source's sha256 (CSV, audiocraft manifest or audiofolder metadata)
        "config": resolved | {"overwrite": None, "max_failure_fraction": None, "out_dir": None},
    }
    if source_info is None:
        fingerprint = musiccaps_fingerprint(fingerprint)

    # 2. rank 0 locks out_dir and prepares .progress/ (a different config is refused unless overwrite)
    store = ProgressStore(out_dir)
    lock = None
    error = None
    if ranks.is_main:
        try:
            lock = lock_out_dir(out_dir)
            store.prepare(fingerprint, split_names, cfg.overwrite, source_change_words(source_info))
        except PipelineError as e:
            error = str(e)
            if lock is not None:
                lock.release()
    agree(ranks, error)
    try:
        return _encode_and_write(
            cfg, ranks, plans, store, encoder, codec_info, source_summary(cfg, source_info, csv_sha),
            segmentation_summary(source_info), resolved, len(rows), workers, progress,
        )  # fmt: skip
    finally:
        if lock is not None:
            lock.release()


def _encode_and_write(
    cfg: PipelineConfig, ranks: RankInfo, plans: list[ShardPlan], store: ProgressStore, encoder: CodecEncoder,
    codec_info: CodecInfo, source: dict, segmentation: dict | None, resolved: dict, n_rows: int, workers: int,
    progress: bool,
) -> RunResult:  # fmt: skip
    out_dir = store.out_dir

    # 3. this rank's shards that need work (new, damaged, or inputs changed), then encode them in order
    todo = [p for p in ranks.owned(plans) if why_redo(store, p, cfg) is not None]
    t0 = time.monotonic()
    audio_s = 0.0
    todo_rows = [r for p in todo for r in p.rows]
    clips = decoded_clips(todo_rows, cfg, encoder.sampling_rate, workers)
    desc = f"encode (rank {ranks.rank}/{ranks.world_size})" if ranks.is_distributed else "encode"
    with tqdm(
        total=len(todo_rows), unit="clip", desc=desc, disable=not progress or ranks.rank != 0, dynamic_ncols=True
    ) as bar:
        for plan in todo:
            rec = encode_shard(plan, clips, encoder, cfg, out_dir)
            store.save(plan, rec)
            audio_s += rec.audio_seconds
            bar.update(len(plan.rows))
            bar.set_postfix_str(f"{audio_s / max(time.monotonic() - t0, 1e-9):.1f} audio-s/s")
    elapsed = time.monotonic() - t0

    # 4. all ranks done; rank 0 assembles failures.jsonl and the manifest from every shard's record
    result = None
    if ranks.is_distributed:
        import torch.distributed as dist

        rates: list[float] = [0.0] * ranks.world_size
        dist.all_gather_object(rates, audio_s)
        audio_s = sum(rates)
    if ranks.is_main:
        result = _write_manifest(cfg, plans, store, codec_info, source, segmentation, resolved, n_rows)
        lines = result.message.splitlines()
        lines.insert(
            -1,
            f"  {elapsed:.1f} s, {audio_s / max(elapsed, 1e-9):.1f} audio-s/s this run "
            f"({len(todo)} shards redone on rank 0, {ranks.world_size} rank(s); skipped shards excluded)",
        )
        result = RunResult(result.manifest, result.out_dir, result.exit_code, "\n".join(lines))
    if ranks.is_distributed:
        import torch.distributed as dist

        box = [result]
        dist.broadcast_object_list(box, src=0)
        result = box[0]
        # No rank tears the group down while another still receives rank 0's result: without this barrier a
        # finished job sometimes aborted on exit ("terminate called without an active exception", about 1 in 30).
        dist.barrier()
        dist.destroy_process_group()
    assert result is not None
    return result


def _write_manifest(
    cfg: PipelineConfig, plans: list[ShardPlan], store: ProgressStore, codec_info: CodecInfo, source: dict,
    segmentation: dict | None, resolved: dict, n_rows: int,
) -> RunResult:  # fmt: skip
    out_dir = store.out_dir
    records: list[ShardRecord] = []
    for plan in plans:
        rec = store.completed(plan)
        if rec is None:
            raise RuntimeError(f"{out_dir / plan.relpath}: no valid shard after all ranks finished; rerun to redo it")
        records.append(rec)
    split_names = [cfg.split.train_name, cfg.split.eval_name]
    store.remove_stale(plans, split_names)  # a split that now has fewer shards (your own audio: a track got shorter)
    splits = {}
    for split in split_names:
        recs = [r for r, p in zip(records, plans) if p.split == split]
        splits[split] = SplitSummary(
            shards=[r.entry for r in recs],
            n_samples=sum(r.entry.n_samples for r in recs),
            audio_seconds=round(sum(r.audio_seconds for r in recs), 6),
            n_frames=sum(r.n_frames for r in recs),
        )
    failures = sorted((f for r in records for f in r.failures), key=lambda f: f.csv_row)
    encoded = sum(s.n_samples for s in splits.values())
    manifest = Manifest(
        codec=codec_info,
        splits=splits,
        totals={
            "rows": n_rows,
            "encoded": encoded,
            "failed": len(failures),
            "audio_seconds": round(sum(s.audio_seconds for s in splits.values()), 6),
            "n_frames": sum(s.n_frames for s in splits.values()),
        },
        failures=failures,
        source=source,
        config=resolved,
        segmentation=segmentation,
    )
    assert manifest.totals["encoded"] + manifest.totals["failed"] == n_rows
    write_failures_jsonl(out_dir / "failures.jsonl", failures)
    write_text_atomic(out_dir / "manifest.json", manifest.to_json())

    # summary and exit status
    lines = [f"shard set: {out_dir} ({sum(len(s.shards) for s in splits.values())} shards)"]
    for name, s in splits.items():
        n_failed = sum(f.split == name for f in failures)
        lines.append(
            f"  {name}: {s.n_samples} encoded, {n_failed} failed, {s.audio_seconds / 3600:.3f} h audio, {s.n_frames} frames"
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
    frac = len(failures) / max(n_rows, 1)
    if encoded == 0:
        code, msg = (
            1,
            f"nothing could be encoded: {len(failures)} of {n_rows} rows failed, see {out_dir / 'failures.jsonl'}",
        )
    elif frac > cfg.max_failure_fraction:
        code, msg = (
            1,
            (
                f"{len(failures)} of {n_rows} rows failed ({frac:.0%} > max_failure_fraction={cfg.max_failure_fraction}); "
                f"see {out_dir / 'failures.jsonl'}. The shards and manifest that were written stay in {out_dir}."
            ),
        )
    elif failures:
        msg = f"ok with {len(failures)} failed rows listed in {out_dir / 'failures.jsonl'}"
    lines.append(msg)
    return RunResult(manifest=manifest, out_dir=out_dir, exit_code=code, message="\n".join(lines))

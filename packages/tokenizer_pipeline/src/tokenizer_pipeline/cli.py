"""`python -m tokenizer_pipeline [hydra overrides]`: MusicCaps CSV + audio -> EnCodec code shards.

Reads top to bottom: parse CSV -> plan shards -> for each shard: decode, batch-encode, write tar ->
failures.jsonl -> manifest.json (last). Configs: conf/tokenizer_pipeline/shards.yaml over the
`PipelineConfig` schema below. `--explain` prints how to point it at audio.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue
from tqdm import tqdm

from .conf_dir import find_conf_dir
from .encode import CodecEncoder
from .errors import UserError
from .manifest import (
    FORMAT_VERSION,
    CodecInfo,
    FailureRecord,
    Manifest,
    SampleRecord,
    SplitSummary,
    library_versions,
    write_failures_jsonl,
    write_text_atomic,
)
from .musiccaps import ClipRow, read_musiccaps_csv
from .read_audio import DURATION_TOLERANCE_S, ClipFailure, load_audio
from .write_shards import PipelineError, ProgressStore, ShardPlan, ShardRecord, ShardTarWriter, check_keys, plan_shards, sha256_file

EXPLAIN = """\
tokenizer_pipeline needs audio: set audio_dir (nothing is downloaded at run time).

Real MusicCaps audio
  One file per CSV row named {ytid}.<ext> (wav, flac, mp3, ogg, m4a, opus, webm), already cut to the
  row's [start_s, end_s] window. `make audio OUT=/path/to/musiccaps_audio` downloads them that way
  (python -m tokenizer_pipeline.download out_dir=...; yt-dlp + an ffmpeg program). Then:
      make shards DATA=/path/to/musiccaps_audio [OUT=build/shards]
      python -m tokenizer_pipeline audio_dir=/path/to/musiccaps_audio out_dir=build/shards
  Full-length source audio instead of 10-s cuts: add crop_to_window=true.
  Missing/unreadable clips are recorded in <out_dir>/failures.jsonl, not fatal.

Offline stand-in (no downloads): a synthetic corpus + a small demo codec
      make demo-shards        (= make corpus codec, then python -m tokenizer_pipeline +preset=demo)
      make demo               (also trains the adapter on those shards)
"""


@dataclass
class CodecConfig:
    name_or_path: str = "facebook/encodec_32khz"  # hub id (must be in the local HF cache offline) or a save_pretrained dir
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | mps
    dtype: str = "float32"  # float32 | bfloat16 (explicit opt-in: faster on GPU, may change codes)
    batch_size: int = 8  # clips per forward pass; higher = faster on GPU, more memory
    bandwidth_kbps: float | None = None  # null = smallest supported (2.2 kbps = 4 codebooks for encodec_32khz)
    pad_batches: bool = False  # true pads unequal lengths together (faster; may change the last frames' codes)


@dataclass
class SplitConfig:
    eval_column: str = "is_audioset_eval"  # boolean CSV column: True -> eval_name, False -> train_name
    train_name: str = "train"
    eval_name: str = "eval"


@dataclass
class ShardConfig:
    max_samples: int = 256  # clips per shard-%06d.tar; ~256 x 10 s x 50 Hz x 4 int16 = ~1 MB per shard


@dataclass
class PipelineConfig:
    csv: str = "data/musiccaps/musiccaps-public.csv"  # MusicCaps metadata (relative to the launch directory)
    audio_dir: str = MISSING  # directory with {ytid}.<ext> files; required (see --explain)
    out_dir: str = "build/shards"  # shard set goes here
    audio_ext: list[str] = field(default_factory=lambda: ["wav", "flac", "mp3", "ogg", "m4a", "opus", "webm"])  # lookup order
    crop_to_window: bool = False  # true: audio files are full-length videos, cut [start_s, end_s] here
    min_seconds: float = 1.0  # shorter clips are recorded as failures
    duration_tolerance_s: float = DURATION_TOLERANCE_S  # |file duration - CSV window| allowed, else duration_mismatch
    max_failure_fraction: float = 0.5  # exit non-zero above this fraction of failed rows
    overwrite: bool = False  # true: delete shards of a previous, different config in out_dir
    limit: int | None = None  # first N CSV rows only (null = all); for quick tries
    codec: CodecConfig = field(default_factory=CodecConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    shard: ShardConfig = field(default_factory=ShardConfig)


ConfigStore.instance().store(name="shards_schema", node=PipelineConfig)


@dataclass(frozen=True)
class RunResult:
    manifest: Manifest
    out_dir: Path
    exit_code: int  # 0 ok; 1 nothing encoded or too many failures
    message: str


def find_audio(audio_dir: Path, ytid: str, exts: list[str]) -> Path:
    """First existing `{audio_dir}/{ytid}.{ext}` in `exts` order; ClipFailure("missing_audio") if none."""
    for ext in exts:
        p = audio_dir / f"{ytid}.{ext.lstrip('.')}"
        if p.is_file():
            return p
    raise ClipFailure("missing_audio", audio_dir / f"{ytid}.*", f"audio file not found: no {ytid}.{{{','.join(exts)}}} in {audio_dir}")


def _sample_record(row: ClipRow, codes_shape: tuple[int, int], n_samples: int, sr: int, src: Path, audio_dir: Path) -> SampleRecord:
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
        n_frames=codes_shape[0],
        n_codebooks=codes_shape[1],
        duration_s=n_samples / sr,
        source_file=src.relative_to(audio_dir).as_posix(),
        source_sha256=sha256_file(src),
    )


def encode_shard(
    plan: ShardPlan, cfg: PipelineConfig, encoder: CodecEncoder, out_dir: Path, bar: tqdm, stats: dict[str, float]
) -> ShardRecord:
    """Decode, encode and write one shard; bad clips become FailureRecords. Memory: one batch of audio."""
    audio_dir = Path(cfg.audio_dir)
    failures: list[FailureRecord] = []
    audio_s, n_frames = 0.0, 0
    with ShardTarWriter(out_dir, plan) as writer:
        for b in range(0, len(plan.rows), cfg.codec.batch_size):
            rows = plan.rows[b : b + cfg.codec.batch_size]
            ok: list[tuple[ClipRow, Path]] = []
            wavs = []  # [N_i] float32 each
            for row in rows:
                try:
                    src = find_audio(audio_dir, row.ytid, cfg.audio_ext)
                    wav = load_audio(
                        src, encoder.sampling_rate, start_s=row.start_s, end_s=row.end_s, crop_to_window=cfg.crop_to_window,
                        duration_tolerance_s=cfg.duration_tolerance_s, min_seconds=cfg.min_seconds,
                    )  # [N]  # fmt: skip
                except ClipFailure as e:
                    failures.append(FailureRecord(ytid=row.ytid, csv_row=row.csv_row, split=row.split, **e.record_fields()))
                    continue
                ok.append((row, src))
                wavs.append(wav)
            for (row, src), wav, codes in zip(ok, wavs, encoder.encode_batch(wavs)):  # codes: [T, K] int16
                rec = _sample_record(row, codes.shape, int(wav.shape[0]), encoder.sampling_rate, src, audio_dir)
                writer.write(rec, codes)
                audio_s += rec.duration_s
                n_frames += rec.n_frames
            stats["audio_s"] += sum(int(w.shape[0]) for w in wavs) / encoder.sampling_rate
            bar.update(len(rows))
            bar.set_postfix_str(f"{stats['audio_s'] / max(time.monotonic() - stats['t0'], 1e-9):.1f} audio-s/s")
        entry = writer.commit()
    return ShardRecord(entry=entry, audio_seconds=audio_s, n_frames=n_frames, failures=failures)


def run_pipeline(cfg: PipelineConfig, *, progress: bool = True) -> RunResult:
    """Run stage 1 end to end. Raises PipelineError for problems the user must fix before anything runs."""
    csv_path, audio_dir, out_dir = Path(cfg.csv), Path(cfg.audio_dir), Path(cfg.out_dir)
    if not audio_dir.is_dir():
        raise PipelineError(f"audio_dir {audio_dir} is not a directory.\n\n{EXPLAIN}")
    if cfg.codec.batch_size < 1:
        raise PipelineError(f"codec.batch_size={cfg.codec.batch_size} must be >= 1")
    split_names = [cfg.split.train_name, cfg.split.eval_name]

    # 1. rows, in CSV order; keys checked before any work
    rows = list(read_musiccaps_csv(csv_path, train_name=split_names[0], eval_name=split_names[1], eval_column=cfg.split.eval_column))
    if cfg.limit is not None:
        rows = rows[: cfg.limit]
    check_keys(rows, csv_path)
    plans = plan_shards(rows, split_names, cfg.shard.max_samples)

    # 2. codec and the config fingerprint that makes resuming safe
    encoder = CodecEncoder(
        cfg.codec.name_or_path, device=cfg.codec.device, dtype=cfg.codec.dtype,
        bandwidth_kbps=cfg.codec.bandwidth_kbps, pad_batches=cfg.codec.pad_batches,
    )  # fmt: skip
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
        num_threads=encoder.num_threads,
    )
    csv_sha = sha256_file(csv_path)
    resolved = asdict(cfg)
    fingerprint = {
        "format_version": FORMAT_VERSION,
        "codec": asdict(codec_info) | {"library_versions": None},
        "device": encoder.device.type,
        "csv_sha256": csv_sha,
        "config": resolved | {"overwrite": None, "max_failure_fraction": None, "out_dir": None},
    }
    store = ProgressStore(out_dir)
    store.prepare(fingerprint, split_names, cfg.overwrite)

    # 3. shards: skip the ones a previous run completed, encode the rest
    records: list[ShardRecord] = []
    stats = {"audio_s": 0.0, "t0": time.monotonic()}
    with tqdm(total=len(rows), unit="clip", desc="encode", disable=not progress, dynamic_ncols=True) as bar:
        for plan in plans:
            rec = store.completed(plan)
            if rec is None:
                rec = encode_shard(plan, cfg, encoder, out_dir, bar, stats)
                store.save(plan, rec)
            else:
                bar.update(len(plan.rows))
            records.append(rec)
    elapsed = time.monotonic() - stats["t0"]

    # 4. failures.jsonl, then manifest.json last (its presence = complete set)
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
            "rows": len(rows),
            "encoded": encoded,
            "failed": len(failures),
            "audio_seconds": round(sum(s.audio_seconds for s in splits.values()), 6),
            "n_frames": sum(s.n_frames for s in splits.values()),
        },
        failures=failures,
        source={"csv": str(csv_path), "csv_sha256": csv_sha, "audio_dir": str(audio_dir)},
        config=resolved,
    )
    assert manifest.totals["encoded"] + manifest.totals["failed"] == len(rows)
    write_failures_jsonl(out_dir / "failures.jsonl", failures)
    write_text_atomic(out_dir / "manifest.json", manifest.to_json())

    # 5. summary and exit status
    lines = [f"shard set: {out_dir} ({sum(len(s.shards) for s in splits.values())} shards)"]
    for name, s in splits.items():
        n_failed = sum(f.split == name for f in failures)
        lines.append(f"  {name}: {s.n_samples} encoded, {n_failed} failed, {s.audio_seconds / 3600:.3f} h audio, {s.n_frames} frames")
    lines.append(f"  {elapsed:.1f} s, {stats['audio_s'] / max(elapsed, 1e-9):.1f} audio-s/s this run (resumed shards excluded)")
    code, msg = 0, "ok"
    frac = len(failures) / max(len(rows), 1)
    if encoded == 0:
        code, msg = 1, f"nothing could be encoded: {len(failures)} of {len(rows)} rows failed, see {out_dir / 'failures.jsonl'}"
    elif frac > cfg.max_failure_fraction:
        code, msg = 1, (
            f"{len(failures)} of {len(rows)} rows failed ({frac:.0%} > max_failure_fraction={cfg.max_failure_fraction}); "
            f"see {out_dir / 'failures.jsonl'}. The shards and manifest that were written stay in {out_dir}."
        )
    elif failures:
        msg = f"ok with {len(failures)} failed rows listed in {out_dir / 'failures.jsonl'}"
    lines.append(msg)
    return RunResult(manifest=manifest, out_dir=out_dir, exit_code=code, message="\n".join(lines))


@hydra.main(config_path=str(find_conf_dir()), config_name="shards", version_base="1.3")
def _hydra_main(dcfg: DictConfig) -> None:
    try:
        cfg: PipelineConfig = OmegaConf.to_object(dcfg)  # typed from here on
    except MissingMandatoryValue as e:
        print(f"error: {e.full_key} is required.\n\n{EXPLAIN}", file=sys.stderr)
        raise SystemExit(2) from e
    try:
        result = run_pipeline(cfg)
    except UserError as e:  # PipelineError, CsvError, ConfigError: the message names the fix
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from e
    print(result.message, file=sys.stderr if result.exit_code else sys.stdout)
    if result.exit_code:
        raise SystemExit(result.exit_code)


def main(argv: list[str] | None = None) -> None:
    """Entry point; `--explain` is handled before Hydra parses argv."""
    args = sys.argv[1:] if argv is None else argv
    if "--explain" in args:
        print(EXPLAIN)
        raise SystemExit(2)
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    _hydra_main()


def config_from_overrides(overrides: list[str]) -> PipelineConfig:
    """Compose the typed config as the CLI would (for tests and notebooks)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(find_conf_dir()), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="shards", overrides=overrides))

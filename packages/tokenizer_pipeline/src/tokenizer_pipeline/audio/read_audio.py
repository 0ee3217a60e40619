"""Stage: decode one clip to float32 mono at the codec's sampling rate, at bounded memory.

wav/flac/ogg/mp3 go through soundfile; other formats through torchcodec (system FFmpeg libraries) or an ffmpeg
program (`ffmpeg_binary.py`). The header's duration is checked against the CSV window before decoding and the decoded
length after, so peak memory per clip is O(window length). Every unusable clip raises `ClipFailure` with a `reason`
from `REASONS` (docs/real-data.md describes the duration policy and the failure reasons).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
import torch

from ..config import DURATION_TOLERANCE_S
from ..shards.manifest import RETRYABLE_REASONS
from .ffmpeg_binary import FFmpegError, FFmpegNotFoundError, decode_window, probe

# Formats libsndfile decodes by itself (mp3 needs libsndfile >= 1.1, which the soundfile wheel bundles).
SOUNDFILE_EXTS = frozenset({".wav", ".flac", ".ogg", ".mp3"})

FFMPEG_FIX = (
    "install FFmpeg shared libraries (e.g. `apt-get install ffmpeg` or `brew install ffmpeg`) "
    "so torchcodec can load them, or convert the audio to wav/flac first "
    "(e.g. `ffmpeg -i in.m4a out.wav` on a machine that has FFmpeg); or `pip install imageio-ffmpeg` (an ffmpeg program in a wheel)"
)

# The closed set of failure reasons, with what each means (and what to do about it).
REASONS: dict[str, str] = {
    "missing_audio": "no {ytid}.<ext> file in audio_dir: download it and rerun",
    "needs_ffmpeg": "the format needs FFmpeg (torchcodec), whose libraries are not installed: " + FFMPEG_FIX,
    "decode_error": "the file is empty, corrupt, unsupported, or decodes to no/non-finite samples",
    "duration_mismatch": "the file's duration differs from the CSV window by more than duration_tolerance_s "
    "(a failed cut, a truncated download, or a full-length file without crop_to_window=true)",
    "too_short": "fewer than min_seconds of audio",
    "resample_error": "resampling to the codec's rate failed",
    "encode_error": "the codec raised on this clip",
    "no_caption": "the track's metadata gives no caption (source.caption / source.caption_column / source.template): "
    "add a description or pick another caption setting",
    "bad_metadata": "the track's own metadata file (sidecar <stem>.json or info_path) is not a readable JSON object: "
    "fix or delete it and rerun the same command (the fixed track is encoded, the rest kept)",
    "bad_path": "your own audio: the file name is not UTF-8 (audiocraft writes such bytes as \\udcXX): rename the file",
    "duplicate_audio": "your own audio: the same audio (path or bytes) as an earlier track, which is encoded: remove one",
    "short_track": "your own audio: the whole track is shorter than segment.min_seconds: no segment (not counted "
    "toward max_failure_fraction)",
    "short_tail": "your own audio: the last segment is shorter than segment.min_seconds and was dropped (not counted "
    "toward max_failure_fraction)",
}


# soxr "VHQ": the least aliasing at bounded memory for any rate pair (benchmarks/bench_resample.py).
SOXR_QUALITY = "VHQ"


class ClipFailure(Exception):
    """One clip that cannot be used: `reason` (a key of `REASONS`), the file (or `{ytid}.*` pattern), the detail with
    its numbers, and the causing exception's type name; `str(err)` is "<reason>: <detail> (<path>)"."""

    def __init__(self, reason: str, path: Path | str, detail: str, *, exc: BaseException | None = None) -> None:
        if reason not in REASONS:
            raise ValueError(f"ClipFailure reason {reason!r} is not one of {sorted(REASONS)}")
        self.reason = reason
        self.path = Path(path)
        self.detail = detail
        self.exc_type = None if exc is None else type(exc).__name__
        self.retryable = reason in RETRYABLE_REASONS or isinstance(exc, (MemoryError, torch.OutOfMemoryError))
        super().__init__(f"{reason}: {detail} ({self.path})")

    def __reduce__(self) -> tuple:
        """Picklable (decode workers send failures back to the main process): rebuilt from its fields."""
        return (_rebuild_clip_failure, (self.reason, str(self.path), self.detail, self.exc_type, self.retryable))

    def record_fields(self) -> dict[str, str | bool | None]:
        """The `reason`, `detail`, `error_type` and `retryable` fields of a `manifest.FailureRecord` for this failure."""
        return {
            "reason": self.reason,
            "detail": f"{self.detail} ({self.path})",
            "error_type": self.exc_type,
            "retryable": self.retryable,
        }

    @classmethod
    def from_exception(cls, reason: str, path: Path | str, exc: BaseException) -> ClipFailure:
        """Wrap an unexpected exception: the detail is "<ExcType>: <first line of its message>"."""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        return cls(reason, path, f"{type(exc).__name__}: {first}", exc=exc)


def _rebuild_clip_failure(
    reason: str, path: str, detail: str, exc_type: str | None, retryable: bool = False
) -> ClipFailure:
    failure = ClipFailure(reason, path, detail)
    failure.exc_type, failure.retryable = exc_type, retryable
    return failure


def find_audio(audio_dir: Path, ytid: str, exts: list[str]) -> Path:
    """First existing `{audio_dir}/{ytid}.{ext}` in `exts` order; ClipFailure("missing_audio") if none."""
    for ext in exts:
        p = audio_dir / f"{ytid}.{ext.lstrip('.')}"
        if p.is_file():
            return p
    raise ClipFailure(
        "missing_audio", audio_dir / f"{ytid}.*", f"audio file not found: no {ytid}.{{{','.join(exts)}}} in {audio_dir}"
    )


def resample(x: np.ndarray, orig_sr: int, target_sr: int) -> np.ndarray:
    """Resample mono float32 `[N]` -> `[round(N * target_sr / orig_sr)]` with soxr (see SOXR_QUALITY)."""
    if orig_sr == target_sr:
        return x
    return soxr.resample(x, orig_sr, target_sr, quality=SOXR_QUALITY)  # [N] -> [round(N * target_sr / orig_sr)]


def _check_header_duration(
    path: Path, duration: float | None, start_s: float | None, end_s: float | None, crop: bool, tol: float
) -> None:
    """The duration policy, applied to the header's duration before decoding (skipped if unknown)."""
    if duration is None or start_s is None or end_s is None:
        return
    if crop and duration < end_s - tol:
        raise ClipFailure(
            "duration_mismatch", path,
            f"file is {duration:.3f} s long and ends before the CSV window [{start_s}, {end_s}] s ends "
            f"(tolerance {tol} s)",
        )  # fmt: skip
    window = end_s - start_s
    if not crop and abs(duration - window) > tol:
        hint = "; if files are full-length videos, set crop_to_window=true" if duration > window else ""
        raise ClipFailure(
            "duration_mismatch", path,
            f"file is {duration:.3f} s long but the CSV window [{start_s}, {end_s}] is {window:.3f} s "
            f"(tolerance {tol} s){hint}",
        )  # fmt: skip


def _span(start_s: float | None, end_s: float | None, crop: bool, tol: float) -> tuple[float, float | None]:
    """(start, length or None = to the end) an FFmpeg decoder reads: the window when cropping, else at most the
    window + tolerance (+1 s) of a cut file, so a header that gives no duration cannot make memory unbounded."""
    if start_s is None or end_s is None:
        return 0.0, None
    return (start_s, end_s - start_s) if crop else (0.0, (end_s - start_s) + tol + 1.0)


def _decode_soundfile(
    path: Path, start_s: float | None, end_s: float | None, crop: bool, tol: float
) -> tuple[np.ndarray, int]:
    """Returns ([N, C] float32, sample rate), reading only the window when `crop`."""
    try:
        with sf.SoundFile(str(path)) as f:
            sr = int(f.samplerate)
            duration = f.frames / sr if f.frames > 0 else None
            _check_header_duration(path, duration, start_s, end_s, crop, tol)
            if crop and start_s is not None and end_s is not None:
                start = int(round(start_s * sr))
                f.seek(min(start, f.frames))  # libsndfile seeks wav/flac/ogg/mp3 without decoding what it skips
                data = f.read(frames=int(round(end_s * sr)) - start, dtype="float32", always_2d=True)  # [N, C]
            else:
                data = f.read(dtype="float32", always_2d=True)  # [N, C]; N bounded by the header check
    except ClipFailure:
        raise
    except (sf.LibsndfileError, RuntimeError, ValueError) as e:
        raise ClipFailure(
            "decode_error", path, f"soundfile cannot decode {path.suffix or 'this'} file: {e}", exc=e
        ) from e
    return data, sr


def _decode_torchcodec(
    path: Path, start_s: float | None, end_s: float | None, crop: bool, tol: float
) -> tuple[np.ndarray, int]:
    """Returns ([N, C] float32, sample rate). Needs the system FFmpeg libraries."""
    fmt = path.suffix.lstrip(".") or "extensionless"
    try:
        from torchcodec.decoders import AudioDecoder
    except ImportError as e:
        raise ClipFailure(
            "needs_ffmpeg", path,
            f"'{fmt}' audio needs torchcodec (pip install 'tokenizer-pipeline[ffmpeg]') and FFmpeg; {FFMPEG_FIX}", exc=e,
        ) from e  # fmt: skip
    try:
        decoder = AudioDecoder(str(path))
    except (RuntimeError, OSError, ValueError) as e:
        msg = str(e)
        if "libtorchcodec" in msg or "FFmpeg is not properly installed" in msg:
            raise ClipFailure(
                "needs_ffmpeg",
                path,
                f"'{fmt}' audio needs FFmpeg, whose libraries are not installed here; {FFMPEG_FIX}",
                exc=e,
            ) from e
        first = msg.splitlines()[0] if msg else repr(e)
        raise ClipFailure("decode_error", path, f"torchcodec cannot open '{fmt}' file: {first}", exc=e) from e
    _check_header_duration(path, decoder.metadata.duration_seconds_from_header, start_s, end_s, crop, tol)
    begin, length = _span(start_s, end_s, crop, tol)
    try:  # only packets in [begin, begin + length) are decoded
        samples = decoder.get_samples_played_in_range(begin, None if length is None else begin + length)
    except (RuntimeError, ValueError) as e:
        raise ClipFailure("decode_error", path, f"torchcodec failed while decoding '{fmt}' file: {e}", exc=e) from e
    data = samples.data.to(torch.float32).T.contiguous().numpy()  # [C, N] -> [N, C]
    return data, int(samples.sample_rate)


def _decode_ffmpeg_binary(
    path: Path, start_s: float | None, end_s: float | None, crop: bool, tol: float
) -> tuple[np.ndarray, int]:
    """Returns ([N, C] float32, sample rate) piped out of an ffmpeg program, the container's duration checked first."""
    try:
        _check_header_duration(path, probe(path).duration_s, start_s, end_s, crop, tol)
        begin, length = _span(start_s, end_s, crop, tol)
        data, sr = decode_window(path, start_s=begin, duration_s=length, mono=False)  # [C, N]
    except FFmpegError as e:
        raise ClipFailure(
            "decode_error", path, f"ffmpeg program cannot decode '{path.suffix.lstrip('.')}' file: {e}", exc=e
        ) from e
    return np.ascontiguousarray(data.T), sr  # [C, N] -> [N, C]


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise ClipFailure("missing_audio", path, "audio file not found")
    if path.stat().st_size == 0:
        raise ClipFailure("decode_error", path, "audio file is 0 bytes (an interrupted copy or download?)")


def audio_header(path: Path) -> tuple[int, int]:
    """(samples per channel, sample rate) from the file's header, without decoding audio.

    soundfile formats give the exact frame count; FFmpeg formats (torchcodec, else an ffmpeg program) give the
    container's duration, turned into samples. Raises ClipFailure (missing_audio, needs_ffmpeg, decode_error).
    """
    path = Path(path)
    _check_file(path)
    if path.suffix.lower() in SOUNDFILE_EXTS:
        try:
            info = sf.info(str(path))
        except (sf.LibsndfileError, RuntimeError, ValueError) as e:
            raise ClipFailure("decode_error", path, f"soundfile cannot read the header: {e}", exc=e) from e
        return int(info.frames), int(info.samplerate)
    duration, sr = _ffmpeg_header(path)
    if duration is None:
        raise ClipFailure("decode_error", path, "the header gives no duration; convert the file to flac or wav")
    return int(round(duration * sr)), sr


def _ffmpeg_header(path: Path) -> tuple[float | None, int]:
    """(duration in seconds or None, sample rate) through torchcodec, else an ffmpeg program."""
    fmt = path.suffix.lstrip(".") or "extensionless"
    try:
        from torchcodec.decoders import AudioDecoder

        meta = AudioDecoder(str(path)).metadata
        return meta.duration_seconds_from_header, int(meta.sample_rate)
    except (ImportError, RuntimeError, OSError, ValueError) as e:
        torchcodec_error = e
    try:
        info = probe(path)
    except FFmpegNotFoundError as e:
        raise ClipFailure(
            "needs_ffmpeg", path, f"'{fmt}' audio needs FFmpeg, which is not available here; {FFMPEG_FIX}", exc=e
        ) from torchcodec_error
    except FFmpegError as e:
        raise ClipFailure("decode_error", path, f"ffmpeg cannot read '{fmt}' file: {e}", exc=e) from e
    return info.duration_s, info.sample_rate


def load_audio(
    path: Path,
    target_sr: int,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
    crop_to_window: bool = False,
    duration_tolerance_s: float = DURATION_TOLERANCE_S,
    min_seconds: float = 0.0,
) -> torch.Tensor:
    """Decode `path` to float32 mono `[round(N * target_sr / sr)]` at `target_sr`, applying the duration policy.

    Args:
        start_s, end_s: the row's CSV window in seconds of the source video; None (both) reads the whole file.
        crop_to_window: True: the file is full-length, read only `[start_s, end_s]`; False: it is the window's cut.
        duration_tolerance_s: allowed |file duration - window length| (uncropped), or how far before
            `end_s` a full-length file may end (cropped).

    Raises:
        ClipFailure: `reason` in `REASONS`. ValueError: a window with `end_s <= start_s`, or `crop_to_window`
            without a window (caller bugs).
    """
    path = Path(path)
    if (start_s is None) != (end_s is None):
        raise ValueError(f"give both start_s and end_s or neither (got {start_s}, {end_s}) for {path}")
    if start_s is not None and end_s is not None and end_s <= start_s:
        raise ValueError(f"crop window end_s={end_s} must be after start_s={start_s} ({path})")
    if crop_to_window and start_s is None:
        raise ValueError(f"crop_to_window=True needs start_s and end_s ({path})")
    _check_file(path)
    if path.suffix.lower() in SOUNDFILE_EXTS:
        data, sr = _decode_soundfile(path, start_s, end_s, crop_to_window, duration_tolerance_s)  # [N, C]
    else:
        try:
            data, sr = _decode_torchcodec(path, start_s, end_s, crop_to_window, duration_tolerance_s)  # [N, C]
        except ClipFailure as e:
            if e.reason != "needs_ffmpeg":
                raise
            try:  # no FFmpeg libraries for torchcodec: use an ffmpeg program if there is one
                data, sr = _decode_ffmpeg_binary(path, start_s, end_s, crop_to_window, duration_tolerance_s)  # [N, C]
            except FFmpegNotFoundError:  # no ffmpeg program either: the torchcodec error says how to get FFmpeg
                raise e from None

    n = data.shape[0]
    if n == 0:
        window = "" if start_s is None else f" in window [{start_s}, {end_s}] s"
        raise ClipFailure("decode_error", path, f"no audio samples decoded{window}")
    if start_s is not None and end_s is not None:  # the header may have lied: check what was decoded
        got, want = n / sr, end_s - start_s
        if abs(got - want) > duration_tolerance_s:
            raise ClipFailure(
                "duration_mismatch", path,
                f"decoded {got:.3f} s but the CSV window [{start_s}, {end_s}] is {want:.3f} s "
                f"(tolerance {duration_tolerance_s} s)",
            )  # fmt: skip
    if n / sr < min_seconds:
        raise ClipFailure("too_short", path, f"{n / sr:.3f} s of audio, need at least {min_seconds} s (min_seconds)")
    finite = np.isfinite(data)
    if not finite.all():
        raise ClipFailure("decode_error", path, f"{int((~finite).sum())} non-finite (NaN/inf) samples")
    del finite

    mono = data.mean(axis=1, dtype=np.float32)  # [N, C] -> [N]
    del data
    try:
        mono = resample(mono, sr, target_sr)  # [N] -> [round(N * target_sr / sr)]
    except (RuntimeError, ValueError, MemoryError) as e:
        raise ClipFailure.from_exception("resample_error", path, e) from e
    if not np.isfinite(mono).all():
        raise ClipFailure("resample_error", path, f"non-finite samples after resampling {sr} -> {target_sr} Hz")
    return torch.from_numpy(np.ascontiguousarray(mono, dtype=np.float32))  # [N']

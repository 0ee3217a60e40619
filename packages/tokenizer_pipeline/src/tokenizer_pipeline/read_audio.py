"""Stage: decode one audio file to float32 mono at the codec's sampling rate.

wav/flac/ogg/mp3 go through soundfile (libsndfile ships inside the wheel, no system libraries).
Everything else (m4a, opus, webm, aac, ...) goes through torchcodec, which loads the system FFmpeg
libraries at run time, or, when those are missing, through an ffmpeg program (ffmpeg_binary.py: the
system's or the imageio-ffmpeg wheel's). Every way a clip can be unusable raises a subclass of `AudioDecodeError`;
the pipeline records those in `failures.jsonl` instead of crashing.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio

from .ffmpeg_binary import FFmpegError, FFmpegNotFoundError, decode_window

# Formats libsndfile decodes by itself (mp3 needs libsndfile >= 1.1, which the soundfile wheel bundles).
SOUNDFILE_EXTS = frozenset({".wav", ".flac", ".ogg", ".mp3"})

FFMPEG_FIX = (
    "install FFmpeg shared libraries (e.g. `apt-get install ffmpeg` or `brew install ffmpeg`) "
    "so torchcodec can load them, or convert the audio to wav/flac first "
    "(e.g. `ffmpeg -i in.m4a out.wav` on a machine that has FFmpeg); or `pip install imageio-ffmpeg` (an ffmpeg program in a wheel)"
)


class AudioDecodeError(Exception):
    """A clip that cannot be used. `kind` is a short stable tag; `str(err)` names the file and the reason."""

    kind = "unreadable"

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.kind}: {reason} ({self.path})")


class AudioMissingError(AudioDecodeError):
    kind = "missing"


class AudioEmptyError(AudioDecodeError):
    kind = "empty"


class AudioTooShortError(AudioDecodeError):
    kind = "too_short"


class AudioNonFiniteError(AudioDecodeError):
    kind = "non_finite"


class FFmpegUnavailableError(AudioDecodeError):
    """The format needs FFmpeg (via torchcodec) and its libraries could not be loaded."""

    kind = "ffmpeg_unavailable"


@functools.lru_cache(maxsize=16)
def _resampler(orig_sr: int, target_sr: int) -> torchaudio.transforms.Resample:
    """One windowed-sinc kernel per rate pair; building it costs more than applying it to a 10-s clip."""
    return torchaudio.transforms.Resample(orig_freq=orig_sr, new_freq=target_sr)


def _window_frames(sr: int, start_s: float | None, end_s: float | None) -> tuple[int, int | None]:
    start = 0 if start_s is None else max(0, int(round(start_s * sr)))
    stop = None if end_s is None else max(start, int(round(end_s * sr)))
    return start, stop


def _decode_soundfile(path: Path, start_s: float | None, end_s: float | None) -> tuple[torch.Tensor, int]:
    """Returns ([C, N] float32, sample rate)."""
    try:
        info = sf.info(str(path))
        start, stop = _window_frames(info.samplerate, start_s, end_s)
        data, sr = sf.read(str(path), start=start, stop=stop, dtype="float32", always_2d=True)  # [N, C]
    except (sf.LibsndfileError, RuntimeError, ValueError) as e:
        raise AudioDecodeError(path, f"soundfile cannot decode {path.suffix or 'this'} file: {e}") from e
    return torch.from_numpy(np.ascontiguousarray(data.T)), int(sr)  # [N, C] -> [C, N]


def _decode_torchcodec(path: Path, start_s: float | None, end_s: float | None) -> tuple[torch.Tensor, int]:
    """Returns ([C, N] float32, sample rate). Needs the system FFmpeg libraries."""
    fmt = path.suffix.lstrip(".") or "extensionless"
    try:
        from torchcodec.decoders import AudioDecoder
    except ImportError as e:
        raise FFmpegUnavailableError(
            path, f"'{fmt}' audio needs torchcodec (pip install 'tokenizer-pipeline[ffmpeg]') and FFmpeg; {FFMPEG_FIX}"
        ) from e
    try:
        decoder = AudioDecoder(str(path))
    except (RuntimeError, OSError) as e:
        msg = str(e)
        if "libtorchcodec" in msg or "FFmpeg is not properly installed" in msg:
            raise FFmpegUnavailableError(
                path, f"'{fmt}' audio needs FFmpeg, whose libraries are not installed here; {FFMPEG_FIX}"
            ) from e
        raise AudioDecodeError(path, f"torchcodec cannot open '{fmt}' file: {msg.splitlines()[0] if msg else e!r}") from e
    try:
        if start_s is None and end_s is None:
            samples = decoder.get_all_samples()
        else:
            samples = decoder.get_samples_played_in_range(start_s or 0.0, end_s)
    except (RuntimeError, ValueError) as e:
        raise AudioDecodeError(path, f"torchcodec failed while decoding '{fmt}' file: {e}") from e
    return samples.data.to(torch.float32), int(samples.sample_rate)  # [C, N]


def _decode_ffmpeg_binary(path: Path, start_s: float | None, end_s: float | None) -> tuple[torch.Tensor, int]:
    """Returns ([C, N] float32, sample rate) piped out of an ffmpeg program (system or the imageio-ffmpeg wheel's)."""
    start = start_s or 0.0
    try:
        data, sr = decode_window(path, start_s=start, duration_s=None if end_s is None else end_s - start, mono=False)
    except FFmpegError as e:
        raise AudioDecodeError(path, str(e)) from e
    return torch.from_numpy(data), sr  # [C, N]


def load_audio(
    path: Path,
    target_sr: int,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
    min_seconds: float = 0.0,
) -> torch.Tensor:
    """Decode `path` to float32 mono at `target_sr`.

    Args:
        path: audio file; the suffix picks the decoder (soundfile for wav/flac/ogg/mp3, else torchcodec).
        target_sr: output sampling rate in Hz (the codec's).
        start_s, end_s: crop window in seconds of the file, only for full-length source audio; by
            default the whole file is used (yt-dlp MusicCaps downloads are already the 10-s window).
        min_seconds: clips shorter than this (after cropping) raise `AudioTooShortError`.

    Returns:
        `[num_samples]` float32 tensor at `target_sr`.

    Raises:
        AudioMissingError, AudioDecodeError, FFmpegUnavailableError, AudioEmptyError,
        AudioTooShortError, AudioNonFiniteError: all subclasses of `AudioDecodeError`.
    """
    path = Path(path)
    if not path.is_file():
        raise AudioMissingError(path, "audio file not found")
    if path.stat().st_size == 0:
        raise AudioEmptyError(path, "audio file is 0 bytes")
    if start_s is not None and end_s is not None and end_s <= start_s:
        raise ValueError(f"crop window end_s={end_s} must be after start_s={start_s} ({path})")

    if path.suffix.lower() in SOUNDFILE_EXTS:
        wav, sr = _decode_soundfile(path, start_s, end_s)  # [C, N]
    else:
        try:
            wav, sr = _decode_torchcodec(path, start_s, end_s)  # [C, N]
        except FFmpegUnavailableError as e:  # no FFmpeg libraries for torchcodec: use an ffmpeg program if there is one
            try:
                wav, sr = _decode_ffmpeg_binary(path, start_s, end_s)  # [C, N]
            except FFmpegNotFoundError:  # no ffmpeg program either: the torchcodec error says how to get FFmpeg
                raise e from None

    if wav.numel() == 0:
        window = "" if start_s is None and end_s is None else f" in window [{start_s}, {end_s}] s"
        raise AudioEmptyError(path, f"no audio samples decoded{window}")
    if not torch.isfinite(wav).all():
        n_bad = int((~torch.isfinite(wav)).sum())
        raise AudioNonFiniteError(path, f"{n_bad} non-finite (NaN/inf) samples")
    duration = wav.shape[-1] / sr
    if duration < min_seconds:
        raise AudioTooShortError(path, f"{duration:.3f} s of audio, need at least {min_seconds} s (min_seconds)")

    mono = wav.mean(dim=0)  # [C, N] -> [N]
    if sr != target_sr:
        mono = _resampler(sr, target_sr)(mono)  # [N] -> [ceil(N * target_sr / sr)]
    if not math.isfinite(float(mono.abs().max())):
        raise AudioNonFiniteError(path, "non-finite samples after resampling")
    return mono.contiguous()

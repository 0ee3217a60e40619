"""The `ffmpeg` program, system-wide or from the `imageio-ffmpeg` wheel: probe, decode a window, cut to flac.

The wheel ships no `ffprobe`, so `probe` parses what `ffmpeg -i` prints; audio comes back through a pipe as raw
float32 PCM (`-f f32le`).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FFMPEG_INSTALL_FIX = (
    "install the Python package imageio-ffmpeg (`pip install imageio-ffmpeg`, part of `make setup`), "
    "which ships an ffmpeg binary, or put a system ffmpeg on PATH (`apt-get install ffmpeg`, `brew install ffmpeg`)"
)


class FFmpegError(RuntimeError):
    """ffmpeg failed on one file; `str(err)` names the file and ends with ffmpeg's own last error lines."""

    def __init__(self, path: Path | str, what: str, stderr: str = "") -> None:
        self.path = Path(path)
        tail = " | ".join(line.strip() for line in stderr.strip().splitlines()[-3:] if line.strip())
        super().__init__(f"{what} ({self.path})" + (f": {tail}" if tail else ""))


class FFmpegNotFoundError(FileNotFoundError):
    """Neither a system ffmpeg nor the imageio-ffmpeg wheel's binary is available."""


@functools.lru_cache(maxsize=1)
def find_ffmpeg() -> str:
    """Path of the ffmpeg executable: `ffmpeg` on PATH first, else the imageio-ffmpeg wheel's binary
    (FFmpegNotFoundError, saying how to get one, when neither exists)."""
    system = shutil.which("ffmpeg")
    if system:
        return system
    try:
        import imageio_ffmpeg
    except ImportError as e:
        raise FFmpegNotFoundError(
            f"no ffmpeg program: none on PATH and imageio-ffmpeg is not installed; {FFMPEG_INSTALL_FIX}"
        ) from e
    try:
        return imageio_ffmpeg.get_ffmpeg_exe()
    except RuntimeError as e:  # the wheel has no binary for this platform
        raise FFmpegNotFoundError(
            f"no ffmpeg program: none on PATH and imageio-ffmpeg has none for this platform ({e}); {FFMPEG_INSTALL_FIX}"
        ) from e


@dataclass(frozen=True)
class MediaInfo:
    """What `ffmpeg -i` says about a file's first audio stream."""

    duration_s: float | None  # container duration; None when ffmpeg prints `Duration: N/A` (e.g. a raw stream)
    sample_rate: int  # Hz
    channels: int  # decoded channel count


_DURATION = re.compile(r"Duration:\s*(\d+):(\d{2}):(\d{2}(?:\.\d+)?)")
_AUDIO = re.compile(r"Stream #\d+:\d+.*?: Audio: (?P<rest>.*)")
_LAYOUT_CHANNELS = {"mono": 1, "stereo": 2, "2.1": 3, "3.0": 3, "quad": 4, "4.0": 4,
                    "5.0": 5, "5.1": 6, "6.1": 7, "7.1": 8}  # fmt: skip


def _run(args: list[str], path: Path) -> subprocess.CompletedProcess:
    if not Path(path).is_file():
        raise FFmpegError(path, "input file not found")
    return subprocess.run([find_ffmpeg(), "-nostdin", "-hide_banner", *args], capture_output=True, check=False)


def probe(path: Path | str) -> MediaInfo:
    """Duration, sample rate and channel count of the first audio stream, from `ffmpeg -i` (no ffprobe); FFmpegError
    when ffmpeg cannot open the file or it has no audio stream."""
    path = Path(path)
    r = _run(["-i", str(path)], path)  # exits 1 ("At least one output file must be specified"); stderr has the info
    return parse_stream_info(r.stderr.decode("utf-8", "replace"), path)


def parse_stream_info(stderr: str, path: Path | str) -> MediaInfo:
    """MediaInfo from `ffmpeg -i` output, e.g. `Stream #0:0(und): Audio: aac (LC), 44100 Hz, stereo, fltp`."""
    m = _AUDIO.search(stderr)
    if m is None:
        raise FFmpegError(path, "ffmpeg found no audio stream (not a media file, or truncated)", stderr)
    fields = [f.strip() for f in m.group("rest").split(",")]  # [codec, rate, layout, sample format, ...]
    hz = [i for i, f in enumerate(fields) if re.fullmatch(r"\d+ Hz", f)]
    if not hz or hz[0] + 1 >= len(fields):
        raise FFmpegError(path, f"ffmpeg printed no sample rate and layout for the audio stream: {m.group('rest')!r}")
    layout = fields[hz[0] + 1]  # "mono", "stereo", "5.1(side)", "3 channels"
    n = re.fullmatch(r"(\d+) channels", layout)
    channels = int(n.group(1)) if n else _LAYOUT_CHANNELS.get(layout.split("(")[0])
    if channels is None:
        raise FFmpegError(path, f"cannot tell the channel count of layout {layout!r}; convert the file to stereo first")
    d = _DURATION.search(stderr)
    duration = int(d.group(1)) * 3600 + int(d.group(2)) * 60 + float(d.group(3)) if d else None
    return MediaInfo(duration_s=duration, sample_rate=int(fields[hz[0]].split()[0]), channels=channels)


_START = re.compile(r"Duration:[^\n]*?, start: (-?\d+(?:\.\d+)?)")
_CONTAINER = re.compile(r"Input #0, ([^,\s]+)")
OPUS_FRAME_SAMPLES = 960  # YouTube's Opus packets: 20 ms at 48 kHz


def section_first_sample(path: Path | str) -> int | None:
    """Where a section starts: the index, in the whole stream, of the first sample a decode of `path` gives.

    `path` is a section cut from a longer stream by stream copy with `-copyts` (yt-dlp's section download,
    see fetch/youtube.py), so its packets keep their timestamps in the whole stream. Exact for the two codecs
    YouTube serves, None for anything else (the caller downloads the whole stream instead):

    - AAC in MP4/M4A: MP4 timestamps count samples (timescale = sample rate), so `round(start * rate)`.
    - Opus: WebM timestamps are whole milliseconds (off by up to 24 samples), but every packet is 20 ms
      (960 samples) and the section's decoder drops the stream's pre-skip from its first packet, so the
      first sample sits on the 960-sample grid: the nearest grid point, if the timestamp is within 1 ms of it.

    FFmpegError when ffmpeg cannot read `path` or it has no audio stream.
    """
    path = Path(path)
    text = _run(["-i", str(path)], path).stderr.decode("utf-8", "replace")
    info = parse_stream_info(text, path)
    start, container, audio = _START.search(text), _CONTAINER.search(text), _AUDIO.search(text)
    if start is None or container is None or audio is None:
        return None
    t, codec = float(start.group(1)) * info.sample_rate, audio.group("rest").split(",")[0].strip()
    if codec.startswith("aac") and container.group(1).startswith("mov"):
        return round(t)
    if codec.startswith("opus") and info.sample_rate == 48000:
        k = round(t / OPUS_FRAME_SAMPLES)
        return k * OPUS_FRAME_SAMPLES if abs(k * OPUS_FRAME_SAMPLES - t) <= info.sample_rate / 1000 else None
    return None


def _window_args(start_s: float, duration_s: float | None) -> list[str]:
    """Output-side `-ss`/`-t` (after `-i`): ffmpeg decodes from the start and drops samples up to `start_s`.

    Input-side seeking (`-ss` before `-i`) is faster but lands on a packet boundary for AAC/Opus.
    """
    if start_s < 0:
        raise ValueError(f"start_s={start_s} must be >= 0")
    if duration_s is not None and duration_s <= 0:
        raise ValueError(f"duration_s={duration_s} must be > 0")
    return (["-ss", f"{start_s:.6f}"] if start_s > 0 else []) + (
        ["-t", f"{duration_s:.6f}"] if duration_s is not None else []
    )


def decode_window(
    path: Path | str,
    *,
    start_s: float = 0.0,
    duration_s: float | None = None,
    sample_rate: int | None = None,
    mono: bool = True,
) -> tuple[np.ndarray, int]:
    """Decode `[start_s, start_s + duration_s)` (None: to the end; a file that ends early gives fewer samples) of
    the first audio stream of any file ffmpeg reads, through a pipe.

    Returns `([C, N]` float32, its rate): `sample_rate` (ffmpeg's resampler; None keeps the source rate), C = 1
    (the channel mean) when `mono`. Raises FFmpegError (unreadable, truncated headers, no audio stream).
    """
    path = Path(path)
    info = probe(path)  # channel count (and the source rate when sample_rate is None)
    rate = sample_rate if sample_rate is not None else info.sample_rate
    args = ["-i", str(path), *_window_args(start_s, duration_s), "-map", "0:a:0", "-vn",
            "-ac", str(info.channels), "-ar", str(rate), "-f", "f32le", "-"]  # fmt: skip
    r = _run(["-loglevel", "error", *args], path)
    if r.returncode != 0:
        raise FFmpegError(path, f"ffmpeg could not decode (exit {r.returncode})", r.stderr.decode("utf-8", "replace"))
    pcm = np.frombuffer(r.stdout, dtype="<f4")  # interleaved [N * C]
    n = pcm.size // info.channels
    x = pcm[: n * info.channels].reshape(n, info.channels).T  # [N, C] -> [C, N]
    # mono: the channel mean, as read_audio does; ffmpeg's own `-ac 1` scales stereo by 1/sqrt(2) instead
    return (x.mean(axis=0, keepdims=True) if mono else np.ascontiguousarray(x)), rate  # [1, N] or [C, N]


# Frames handed to the flac encoder after the trim: a FLAC block size valid at every rate (the format's
# minimum is 16 samples, except for the last frame).
FLAC_FRAME_SAMPLES = 4096


def window_samples(start_s: float, duration_s: float, sample_rate: int) -> tuple[int, int]:
    """Samples `[a, b)` of a window: `a = round(start_s * sr)`, `b = round((start_s + duration_s) * sr)`.

    The rounding read_audio uses to crop a window (Python's `round`, half to even).
    """
    if start_s < 0:
        raise ValueError(f"start_s={start_s} must be >= 0")
    if duration_s <= 0:
        raise ValueError(f"duration_s={duration_s} must be > 0")
    return round(start_s * sample_rate), round((start_s + duration_s) * sample_rate)


def cut_to_flac(src: Path | str, dst: Path | str, *, start_s: float, duration_s: float, first_sample: int = 0) -> Path:
    """Write `[start_s, start_s + duration_s)` of `src`'s first audio stream to `dst` as 16-bit flac.

    Keeps the source's sample rate and channels; the samples are `window_samples(...)` of the stream
    decoded from its first sample (what a direct decode of the whole file gives), so the cut is
    sample-exact for every codec, rate and start. A section of a longer stream (`section_first_sample`)
    passes `first_sample`, the whole stream's index of its own first sample: the window keeps the whole
    stream's times and samples. 16 bits suffice for lossy AAC/Opus sources. Written to a temporary
    name in `dst`'s directory, then renamed, so `dst` is either complete or absent.

    The trim is a filter chain, not `-ss`/`-t`: an output-side `-ss` can hand the flac encoder a frame
    below its 16-sample minimum ("invalid block size"). `asetpts=N/SR/TB` numbers the decoded samples
    from 0 (so AAC/Opus priming timestamps cannot shift it), `atrim` keeps `[a, b)` and `asetnsamples`
    re-frames them into FLAC_FRAME_SAMPLES-sample frames. FFmpegError when ffmpeg fails: no `dst`, no temporary file.
    """
    src, dst = Path(src), Path(dst)
    a, b = window_samples(start_s, duration_s, probe(src).sample_rate)
    if a < first_sample:
        raise ValueError(f"the window starts at sample {a}, before the section's first sample {first_sample} ({src})")
    a, b = a - first_sample, b - first_sample
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    trim = f"asetpts=N/SR/TB,atrim=start_sample={a}:end_sample={b},asetnsamples=n={FLAC_FRAME_SAMPLES}:p=0"
    args = ["-i", str(src), "-map", "0:a:0", "-vn", "-af", trim,
            "-c:a", "flac", "-sample_fmt", "s16", "-f", "flac", "-y", str(tmp)]  # fmt: skip
    try:
        r = _run(["-loglevel", "error", *args], src)
        if r.returncode != 0:
            raise FFmpegError(src, f"ffmpeg could not cut [{start_s}, {start_s + duration_s}] s to flac (exit {r.returncode})",
                              r.stderr.decode("utf-8", "replace"))  # fmt: skip
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst

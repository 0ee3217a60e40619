"""`cut_to_flac` over a grid of source codecs, sample rates and window starts: every cut is written, has
exactly the window's sample count and is aligned to the sample with a direct decode of the same source.

The starts that broke the output-side `-ss` trim (flac refused a first frame of 8 samples: 30 s of a
44.1 kHz wav, 30 s of a 44.1 kHz AAC m4a) are in the grid, with a late one (290 s) and a fractional one.
"""

from __future__ import annotations

from functools import cache, lru_cache
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import tokenizer_pipeline.audio.ffmpeg_binary as fb
from tests.pipeline.media_server import encode_wav, music_like, write_signal

WINDOW_S = 10.0
STARTS = [0.0, 10.0, 20.0, 30.0, 290.0, 12.345]
SOURCE_S = 301.0  # long enough for the 290-s start; music where windows fall, silence between (cheap to encode)
MUSIC_SPANS = [(0.0, 42.5), (289.0, SOURCE_S)]
# (container, rate of the master the source was encoded from). Opus always decodes at 48 kHz, whatever the
# master's rate; AAC has no 37.8 kHz, so its odd rate is 22.05 kHz.
SOURCES = [("wav", 44100), ("wav", 48000), ("wav", 37800), ("flac", 44100), ("flac", 48000), ("flac", 37800),
           ("m4a", 44100), ("m4a", 48000), ("m4a", 22050), ("webm", 44100), ("webm", 48000)]  # fmt: skip
LSB = 1 / 32768  # one step of the flac's 16 bits


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cut_sources")


@cache
def _master(root: Path, rate: int, channels: int) -> Path:
    """A SOURCE_S-long 16-bit wav: music where windows fall, silence between (cheap to encode). One per rate and
    channel count: a wav source is its master, the other containers are encoded from theirs."""
    path = root / f"master-{rate}-{channels}.wav"
    x = np.zeros((int(SOURCE_S * rate), channels), dtype=np.float32)  # [N, C]
    for i, (a, b) in enumerate(MUSIC_SPANS):
        ia, ib = int(a * rate), int(b * rate)
        x[ia:ib] = music_like((ib - ia) / rate, rate, channels, seed=i)[: ib - ia]  # [n, C]
    sf.write(path, x, rate, subtype="PCM_16")
    return path


@cache
def _source(root: Path, ext: str, rate: int) -> tuple[Path, int]:
    """(the source file, the rate ffmpeg decodes it at): lossless ones in stereo, lossy ones in mono at a low bitrate
    (fast to encode)."""
    master = _master(root, rate, 2 if ext in ("wav", "flac") else 1)
    path = master if ext == "wav" else encode_wav(master, root / f"{rate}.{ext}", bitrate="48k")
    return path, fb.probe(path).sample_rate


@lru_cache(maxsize=1)
def _direct_decode(path: Path) -> np.ndarray:
    """`[N, C]` float32: the whole source decoded from its first sample, no seeking, no trimming."""
    return fb.decode_window(path, mono=False)[0].T  # [C, N] -> [N, C]


@pytest.mark.parametrize("start_s", STARTS)
@pytest.mark.parametrize("ext, rate", SOURCES, ids=[f"{e}-{r}" for e, r in SOURCES])
def test_cut_to_flac_is_sample_exact_for_every_start_rate_and_codec(
    source_dir: Path, tmp_path: Path, ext: str, rate: int, start_s: float
) -> None:
    src, sr = _source(source_dir, ext, rate)  # sr: the decoded rate, 48 kHz for every Opus source
    assert sr == (48000 if ext == "webm" else rate)
    out = fb.cut_to_flac(src, tmp_path / "cut.flac", start_s=start_s, duration_s=WINDOW_S)
    y, got_sr = sf.read(out, dtype="float32", always_2d=True)  # [n, C]
    assert got_sr == sr and sf.info(str(out)).subtype == "PCM_16"
    a, b = round(start_s * sr), round((start_s + WINDOW_S) * sr)  # the window's samples [a, b) of the source
    ref = _direct_decode(src)[a:b]  # [n, C]
    assert y.shape == ref.shape, (y.shape, ref.shape)
    # same samples up to the 16-bit rounding; one sample off would differ by far more (the music moves
    # ~0.01 per sample), checked so this test can tell an aligned cut from a shifted one
    np.testing.assert_allclose(y, ref, rtol=0, atol=LSB)
    assert np.abs(y[1:] - ref[:-1]).max() > 20 * LSB


def test_cut_to_flac_keeps_a_last_frame_shorter_than_flac_s_minimum_block(tmp_path: Path) -> None:
    """Windows whose length leaves a final frame of a few samples (flac allows it only as the last frame)."""
    sr = 44100
    x = music_like(3.0, sr, 2)  # [N, C]
    write_signal(tmp_path / "a.wav", x, sr)
    ref = _direct_decode(tmp_path / "a.wav")
    for n in (4096 * 20 + 1, 4096 * 20 + 8, 4096 * 20 + 15):  # frames of 4096 plus a tail of 1, 8, 15 samples
        a = 44100 + 8  # a start 8 samples before a 4096-sample boundary of the wav decoder's frames
        out = fb.cut_to_flac(tmp_path / "a.wav", tmp_path / f"c{n}.flac", start_s=a / sr, duration_s=n / sr)
        y, _ = sf.read(out, dtype="float32", always_2d=True)  # [n, C]
        np.testing.assert_array_equal(y, ref[a : a + n])

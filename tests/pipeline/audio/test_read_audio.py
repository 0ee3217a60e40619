from __future__ import annotations

import pickle
import sys
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch

from tokenizer_pipeline.audio.read_audio import REASONS, ClipFailure, load_audio


def _sine(freq: float, sr: int, seconds: float, channels: int = 1) -> np.ndarray:
    t = np.arange(int(sr * seconds)) / sr
    x = 0.5 * np.sin(2 * np.pi * freq * t).astype(np.float32)  # [N]
    return np.stack([x] * channels, axis=1)  # [N, C]


def _peak_hz(x: torch.Tensor, sr: int) -> float:
    spec = torch.fft.rfft(x * torch.hann_window(x.shape[0]))  # [N // 2 + 1]
    return float(spec.abs().argmax()) * sr / x.shape[0]


def _fails(reason: str, path: Path, target_sr: int = 32000, **kw) -> ClipFailure:
    with pytest.raises(ClipFailure) as ei:
        load_audio(path, target_sr, **kw)
    assert ei.value.reason == reason, str(ei.value)
    assert str(ei.value).startswith(f"{reason}: ") and str(path) in str(ei.value)
    return ei.value


def _write_long_wav(path: Path, sr: int, seconds: int) -> None:
    """A long 16-bit wav written in 1-s blocks (the test itself never holds it in memory)."""
    block = (0.25 * np.sin(2 * np.pi * 440 * np.arange(sr) / sr)).astype(np.float32)  # [sr]
    with sf.SoundFile(path, "w", samplerate=sr, channels=1, subtype="PCM_16") as f:
        for _ in range(seconds):
            f.write(block)


def _peak_traced_bytes(fn) -> tuple[object, int]:
    """Run `fn()` under tracemalloc (numpy buffers are traced); returns (result, peak bytes)."""
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- decoding, downmix, formats ---


def test_resample_44k1_to_32k_keeps_length_and_frequency(tmp_path: Path) -> None:
    p = tmp_path / "a.wav"
    sf.write(p, _sine(1000.0, 44100, 2.0), 44100)
    y = load_audio(p, 32000)
    assert y.dtype == torch.float32 and y.ndim == 1
    assert y.shape[0] == 64000
    assert abs(_peak_hz(y, 32000) - 1000.0) < 1.0


def test_stereo_is_downmixed_by_mean(tmp_path: Path) -> None:
    x = _sine(440.0, 32000, 1.0, channels=2)  # [N, 2]
    x[:, 1] = 0.0
    p = tmp_path / "st.flac"
    sf.write(p, x, 32000)
    y = load_audio(p, 32000)
    assert y.shape == (32000,)
    np.testing.assert_allclose(y.numpy(), x[:, 0] / 2, atol=1e-4)  # flac is 16-bit


@pytest.mark.parametrize("ext", ["wav", "flac", "ogg", "mp3"])
def test_soundfile_formats(tmp_path: Path, ext: str) -> None:
    p = tmp_path / f"a.{ext}"
    sf.write(p, _sine(440.0, 48000, 1.0), 48000)
    y = load_audio(p, 32000, start_s=0.0, end_s=1.0)  # lossy codecs pad/trim a little: within tolerance
    assert abs(y.shape[0] - 32000) < 2000
    assert abs(_peak_hz(y[:30000], 32000) - 440.0) < 3.0


def test_unsupported_format_without_ffmpeg_names_the_fix(tmp_path: Path) -> None:
    p = tmp_path / "clip.m4a"
    p.write_bytes(b"\x00\x00\x00\x18ftypM4A not really audio")
    with pytest.raises(ClipFailure) as ei:
        load_audio(p, 32000)
    msg = str(ei.value)
    assert str(p) in msg and "m4a" in msg
    if ei.value.reason == "needs_ffmpeg":  # this machine: no FFmpeg libraries
        assert "apt-get install ffmpeg" in msg and "convert" in msg and "wav" in msg
    else:  # FFmpeg present (libraries for torchcodec, or an ffmpeg program): it tried and rejected the garbage bytes
        assert ei.value.reason == "decode_error" and ("torchcodec" in msg or "ffmpeg found no audio stream" in msg)
    assert ei.value.exc_type is not None  # the underlying exception's type is kept


def test_failure_reasons(tmp_path: Path) -> None:
    _fails("missing_audio", tmp_path / "nope.wav")
    (tmp_path / "zero.wav").write_bytes(b"")
    assert "0 bytes" in _fails("decode_error", tmp_path / "zero.wav").detail
    (tmp_path / "junk.wav").write_bytes(b"RIFF not a wav at all" * 10)
    junk = _fails("decode_error", tmp_path / "junk.wav")
    assert "soundfile cannot decode" in junk.detail and junk.exc_type == "LibsndfileError"
    sf.write(tmp_path / "short.wav", _sine(440.0, 32000, 0.2), 32000)
    assert "0.200 s" in _fails("too_short", tmp_path / "short.wav", min_seconds=1.0).detail
    x = _sine(440.0, 32000, 1.0)
    x[100, 0] = np.nan
    sf.write(tmp_path / "nan.wav", x, 32000, subtype="FLOAT")
    assert "1 non-finite" in _fails("decode_error", tmp_path / "nan.wav").detail


def test_clip_failure_interface() -> None:
    with pytest.raises(ValueError, match="not one of"):
        ClipFailure("exploded", "a.wav", "x")
    f = ClipFailure.from_exception("encode_error", "a.wav", RuntimeError("CUDA out of memory\nmore lines"))
    assert (f.reason, f.exc_type, f.detail) == ("encode_error", "RuntimeError", "RuntimeError: CUDA out of memory")
    assert str(f) == "encode_error: RuntimeError: CUDA out of memory (a.wav)"
    assert f.record_fields() == {"reason": "encode_error", "detail": "RuntimeError: CUDA out of memory (a.wav)",
                                 "error_type": "RuntimeError", "retryable": True}  # fmt: skip
    g = pickle.loads(pickle.dumps(f))  # crosses process boundaries (decode workers)
    assert type(g) is ClipFailure and str(g) == str(f)
    assert (g.reason, g.path, g.detail, g.exc_type, g.retryable) == (f.reason, f.path, f.detail, f.exc_type, True)
    # final unless the cause can go away: a corrupt file stays corrupt, running out of memory may not happen again
    assert ClipFailure("decode_error", "a.wav", "corrupt").retryable is False
    oom = ClipFailure.from_exception("decode_error", "a.wav", MemoryError("cannot allocate"))
    assert oom.retryable is True and pickle.loads(pickle.dumps(oom)).retryable is True
    assert {"missing_audio", "needs_ffmpeg", "decode_error", "duration_mismatch", "too_short", "resample_error",
            "encode_error", "no_caption", "bad_metadata", "bad_path", "duplicate_audio", "short_track",
            "short_tail"} == set(REASONS)  # fmt: skip
    assert ClipFailure("no_caption", "a.wav", "no description").retryable is False  # redone when the metadata changes


# --- duration policy ---


def test_crop_window(tmp_path: Path) -> None:
    sr = 16000
    x = np.zeros((sr * 3, 1), np.float32)
    x[sr : 2 * sr] = 0.5  # a plateau in [1, 2) s
    p = tmp_path / "full.wav"
    sf.write(p, x, sr, subtype="FLOAT")
    y = load_audio(p, sr, start_s=1.0, end_s=2.0, crop_to_window=True)
    assert y.shape == (sr,) and torch.allclose(y, torch.full((sr,), 0.5))
    assert load_audio(p, sr).shape == (3 * sr,)  # no window given: the whole file, no duration check
    assert "ends before" in _fails("duration_mismatch", p, sr, start_s=5.0, end_s=6.0, crop_to_window=True).detail


def test_truncated_download_fails_as_duration_mismatch(tmp_path: Path) -> None:
    """A 10-s wav cut off after 6 s (bytes missing at the end): never encoded as 6 s."""
    sr = 8000
    full = tmp_path / "full.wav"
    sf.write(full, _sine(440.0, sr, 10.0), sr, subtype="PCM_16")
    trunc = tmp_path / "trunc.wav"
    trunc.write_bytes(full.read_bytes()[: 44 + 6 * sr * 2])  # 44-byte header + 6 s of int16
    assert load_audio(full, sr, start_s=30.0, end_s=40.0).shape == (10 * sr,)
    f = _fails("duration_mismatch", trunc, sr, start_s=30.0, end_s=40.0)
    assert "6.000 s" in f.detail and "10.000 s" in f.detail
    # cropped from a full-length file that ends at 36 s, before the window [30, 40] ends
    long = tmp_path / "long.wav"
    _write_long_wav(long, sr, 36)
    _fails("duration_mismatch", long, sr, start_s=30.0, end_s=40.0, crop_to_window=True)


def test_tolerance_accepts_small_differences(tmp_path: Path) -> None:
    sr = 8000
    p = tmp_path / "a.wav"
    sf.write(p, _sine(440.0, sr, 10.3), sr)
    assert load_audio(p, sr, start_s=0.0, end_s=10.0).shape == (int(10.3 * sr),)  # default tolerance 0.5 s
    _fails("duration_mismatch", p, sr, start_s=0.0, end_s=10.0, duration_tolerance_s=0.1)


def test_long_uncropped_file_fails_without_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 20-min file where the cut failed: rejected from its header, no sample decoded."""
    p = tmp_path / "video.wav"
    _write_long_wav(p, 8000, 1200)
    reads: list[object] = []
    real_read = sf.SoundFile.read
    monkeypatch.setattr(sf.SoundFile, "read", lambda self, *a, **k: reads.append(k) or real_read(self, *a, **k))
    f = _fails("duration_mismatch", p, start_s=30.0, end_s=40.0)
    assert "1200.000 s" in f.detail and "crop_to_window=true" in f.detail
    assert reads == []


def test_long_file_with_crop_reads_only_the_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Peak memory is bounded by the window: 10 s of a 20-min file (the whole file as float32 = 38 MB)."""
    sr = 8000
    p = tmp_path / "video.wav"
    _write_long_wav(p, sr, 1200)
    reads: list[int] = []
    real_read = sf.SoundFile.read
    monkeypatch.setattr(
        sf.SoundFile, "read", lambda self, frames=-1, **k: reads.append(frames) or real_read(self, frames, **k)
    )
    y, peak = _peak_traced_bytes(lambda: load_audio(p, 32000, start_s=600.0, end_s=610.0, crop_to_window=True))
    assert y.shape == (320000,)
    assert reads == [10 * sr]
    assert peak < 8e6, f"peak {peak / 1e6:.1f} MB traced; the window needs ~1.6 MB, the whole file 38 MB"


# --- resampling ---


@pytest.mark.parametrize("sr", [44101, 47999, 22050, 48000])
def test_any_rate_resamples_with_the_promised_length(tmp_path: Path, sr: int) -> None:
    """gcd(44101, 32000) = 1: torchaudio's polyphase kernel for it asked for 11 GB."""
    p = tmp_path / "odd.wav"
    x = _sine(1000.0, sr, 2.0)
    sf.write(p, x, sr, subtype="FLOAT")
    y = load_audio(p, 32000, start_s=0.0, end_s=2.0)
    assert y.shape == (round(x.shape[0] * 32000 / sr),)
    assert abs(_peak_hz(y, 32000) - 1000.0) < 1.0


def test_anti_aliasing_at_least_80_db(tmp_path: Path) -> None:
    """A 17 kHz tone in a 44.1 kHz file lies above the 16 kHz Nyquist of 32 kHz: resampling must
    remove it (it would alias to 15 kHz) >= 80 dB below a 1 kHz passband tone of equal amplitude."""
    sr, n = 44100, 44100
    t = np.arange(n) / sr
    x = (0.4 * np.sin(2 * np.pi * 1000 * t) + 0.4 * np.sin(2 * np.pi * 17000 * t)).astype(np.float32)  # [N]
    p = tmp_path / "tones.wav"
    sf.write(p, x, sr, subtype="FLOAT")
    y = load_audio(p, 32000).numpy()  # [32000]
    spec = np.abs(np.fft.rfft(y * np.blackman(y.shape[0])))  # [16001], 1 Hz bins
    passband = spec[990:1011].max()
    alias = spec[14900:15101].max()  # where 17 kHz folds to: 32 - 17 = 15 kHz
    assert 20 * np.log10(alias / passband) <= -80.0


# --- the torchcodec path (FFmpeg formats), with a stand-in decoder: this machine has no FFmpeg ---


class _FakeAudioDecoder:
    """Stands in for torchcodec's AudioDecoder: a header duration and a record of the ranges decoded."""

    header_s: float | None = 600.0
    calls: list[tuple[float, float | None]] = []

    def __init__(self, source: str) -> None:
        self.metadata = SimpleNamespace(duration_seconds_from_header=self.header_s, sample_rate=48000)

    def get_samples_played_in_range(self, start_seconds: float = 0.0, stop_seconds: float | None = None):
        type(self).calls.append((start_seconds, stop_seconds))
        stop = self.header_s if stop_seconds is None else min(stop_seconds, self.header_s or 1e9)
        n = int(round((stop - start_seconds) * 48000))
        return SimpleNamespace(data=torch.zeros(2, n), sample_rate=48000)  # [C, N]


@pytest.fixture()
def fake_torchcodec(monkeypatch: pytest.MonkeyPatch):
    _FakeAudioDecoder.calls = []
    _FakeAudioDecoder.header_s = 600.0
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", SimpleNamespace(AudioDecoder=_FakeAudioDecoder))
    return _FakeAudioDecoder


def test_torchcodec_path_applies_the_duration_policy(tmp_path: Path, fake_torchcodec) -> None:
    p = tmp_path / "video.m4a"
    p.write_bytes(b"not read by the stand-in")
    y = load_audio(p, 32000, start_s=100.0, end_s=110.0, crop_to_window=True)
    assert y.shape == (320000,) and fake_torchcodec.calls == [(100.0, 110.0)]  # only the window
    fake_torchcodec.calls.clear()
    assert "600.000 s" in _fails("duration_mismatch", p, start_s=100.0, end_s=110.0).detail
    assert fake_torchcodec.calls == []  # rejected from the header, nothing decoded
    fake_torchcodec.header_s = None  # no duration in the header: decode at most window + tolerance + 1 s
    _fails("duration_mismatch", p, start_s=100.0, end_s=110.0)
    assert fake_torchcodec.calls == [(0.0, 11.5)]

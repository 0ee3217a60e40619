from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from tokenizer_pipeline.read_audio import (
    AudioDecodeError,
    AudioEmptyError,
    AudioMissingError,
    AudioNonFiniteError,
    AudioTooShortError,
    FFmpegUnavailableError,
    load_audio,
)


def _sine(freq: float, sr: int, seconds: float, channels: int = 1) -> np.ndarray:
    t = np.arange(int(sr * seconds)) / sr
    x = 0.5 * np.sin(2 * np.pi * freq * t).astype(np.float32)  # [N]
    return np.stack([x] * channels, axis=1)  # [N, C]


def _peak_hz(x: torch.Tensor, sr: int) -> float:
    spec = torch.fft.rfft(x * torch.hann_window(x.shape[0]))  # [N // 2 + 1]
    return float(spec.abs().argmax()) * sr / x.shape[0]


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
    y = load_audio(p, 32000)
    assert abs(y.shape[0] - 32000) < 2000  # lossy codecs pad/trim a little
    assert abs(_peak_hz(y[:30000], 32000) - 440.0) < 3.0


def test_crop_window(tmp_path: Path) -> None:
    sr = 16000
    x = np.zeros((sr * 3, 1), np.float32)
    x[sr : 2 * sr] = 0.5  # a plateau in [1, 2) s
    p = tmp_path / "full.wav"
    sf.write(p, x, sr, subtype="FLOAT")
    y = load_audio(p, sr, start_s=1.0, end_s=2.0)
    assert y.shape == (sr,) and torch.allclose(y, torch.full((sr,), 0.5))
    assert load_audio(p, sr).shape == (3 * sr,)  # no crop unless asked
    with pytest.raises(AudioEmptyError, match="window"):
        load_audio(p, sr, start_s=5.0, end_s=6.0)


def test_unsupported_format_without_ffmpeg_names_the_fix(tmp_path: Path) -> None:
    p = tmp_path / "clip.m4a"
    p.write_bytes(b"\x00\x00\x00\x18ftypM4A not really audio")
    with pytest.raises(AudioDecodeError) as ei:
        load_audio(p, 32000)
    msg = str(ei.value)
    assert str(p) in msg and "m4a" in msg
    if isinstance(ei.value, FFmpegUnavailableError):  # this machine: no FFmpeg libraries
        assert "apt-get install ffmpeg" in msg and "convert" in msg and "wav" in msg
    else:  # FFmpeg present (libraries for torchcodec, or an ffmpeg program): it tried and rejected the garbage bytes
        assert "torchcodec" in msg or "ffmpeg found no audio stream" in msg


def test_failure_kinds(tmp_path: Path) -> None:
    with pytest.raises(AudioMissingError):
        load_audio(tmp_path / "nope.wav", 32000)
    (tmp_path / "zero.wav").write_bytes(b"")
    with pytest.raises(AudioEmptyError):
        load_audio(tmp_path / "zero.wav", 32000)
    (tmp_path / "junk.wav").write_bytes(b"RIFF not a wav at all" * 10)
    with pytest.raises(AudioDecodeError, match="soundfile cannot decode") as ei:
        load_audio(tmp_path / "junk.wav", 32000)
    assert ei.value.kind == "unreadable"
    sf.write(tmp_path / "short.wav", _sine(440.0, 32000, 0.2), 32000)
    with pytest.raises(AudioTooShortError, match="0.200 s"):
        load_audio(tmp_path / "short.wav", 32000, min_seconds=1.0)
    x = _sine(440.0, 32000, 1.0)
    x[100, 0] = np.nan
    sf.write(tmp_path / "nan.wav", x, 32000, subtype="FLOAT")
    with pytest.raises(AudioNonFiniteError, match="1 non-finite"):
        load_audio(tmp_path / "nan.wav", 32000)

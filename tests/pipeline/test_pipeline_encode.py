from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tokenizer_pipeline.encode import CodecEncoder, hash_weight_files


def _clips(lengths: list[int], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(max(lengths)) / 32000
    return [(0.3 * torch.sin(2 * torch.pi * (200 + 50 * i) * t[:n]) + 0.05 * torch.randn(n, generator=g)) for i, n in enumerate(lengths)]


def test_properties_and_shapes(tiny_codec: Path) -> None:
    enc = CodecEncoder(str(tiny_codec), device="cpu")
    assert (enc.sampling_rate, enc.frame_rate, enc.n_codebooks, enc.codebook_size) == (32000, 50, 4, 64)
    assert enc.bandwidth_kbps == 1.2 and enc.dtype == "float32"
    assert enc.weights_sha256 == hash_weight_files(tiny_codec) and len(enc.weights_sha256) == 64
    (codes,) = enc.encode_batch(_clips([32000 - 100]))
    assert codes.dtype == np.int16 and codes.shape == (50, 4)  # ceil(31900 / 640) = 50
    assert codes.min() >= 0 and codes.max() < 64
    assert len(np.unique(codes[:, 0])) > 3  # random codebooks: codes depend on the audio


def test_batched_equals_one_by_one(tiny_codec: Path) -> None:
    enc = CodecEncoder(str(tiny_codec), device="cpu")
    wavs = _clips([32000, 32000, 25000, 31000, 32000])
    single = [enc.encode_batch([w])[0] for w in wavs]
    batched = enc.encode_batch(wavs)
    for s, b, w in zip(single, batched, wavs):
        assert b.shape == (enc.n_frames(w.shape[0]), 4)
        np.testing.assert_array_equal(s, b)


def test_padded_batches_match_except_the_tail_of_shorter_clips(tiny_codec: Path) -> None:
    """pad_batches=True: equal lengths match exactly; a shorter clip's codes match except for the last
    frames, whose non-causal receptive field reaches into the zero padding (why it is off by default)."""
    enc = CodecEncoder(str(tiny_codec), device="cpu", pad_batches=True)
    wavs = _clips([32000, 32000, 25000])
    single = [enc.encode_batch([w])[0] for w in wavs]
    padded = enc.encode_batch(wavs)
    np.testing.assert_array_equal(padded[0], single[0])
    np.testing.assert_array_equal(padded[1], single[1])
    assert padded[2].shape == single[2].shape == (40, 4)
    np.testing.assert_array_equal(padded[2][:30], single[2][:30])


def test_rejects_bad_options_with_the_allowed_values(tiny_codec: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"allowed: \[1.2\]"):
        CodecEncoder(str(tiny_codec), device="cpu", bandwidth_kbps=6.0)
    with pytest.raises(ValueError, match="float32"):
        CodecEncoder(str(tiny_codec), device="cpu", dtype="float16")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            CodecEncoder(str(tiny_codec), device="cuda")
    with pytest.raises(FileNotFoundError, match="make codec"):
        CodecEncoder(str(tmp_path / "missing_codec"), device="cpu")


def test_bfloat16_is_explicit_and_recorded(tiny_codec: Path) -> None:
    enc = CodecEncoder(str(tiny_codec), device="cpu", dtype="bfloat16")
    assert enc.dtype == "bfloat16" and next(enc.model.parameters()).dtype == torch.bfloat16
    (codes,) = enc.encode_batch(_clips([16000]))
    assert codes.shape == (25, 4) and codes.dtype == np.int16


def test_normalizing_codec_is_rejected(tiny_codec: Path, tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "scaled"
    shutil.copytree(tiny_codec, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["normalize"] = True
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="Scaled codec not supported"):
        CodecEncoder(str(d), device="cpu")

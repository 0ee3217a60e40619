"""Demo codec: encodec_32khz architecture, fitted (non-degenerate) codebooks, from_pretrained round trip.

Full-size architecture (~0.25 s of CPU per second of audio on one thread), so the fixture fits on 24 clips of
5 s (6000 latent frames >= 2048 centroids) instead of 10-s clips. The fit cannot be smaller: encoding the clips is
nearly all of its cost, and test_codes_not_degenerate needs the 6000 frames (measured with this seed: 4000 or 5000
frames leave the deepest codebook at 3.2-3.7 nats, at or under its ln 32 = 3.47 bound; 6000 give 4.1). The tests
share the fit, its reloaded copy and that copy's codes of the first clip instead.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from transformers import EncodecFeatureExtractor, EncodecModel

from tests import REPO
from tokenizer_pipeline.demo.demo_codec import (
    build_random_model,
    code_stats,
    corpus_files,
    encode_file,
    fit_codebooks,
    fit_demo_codec,
    quantize_latents,
    save_demo_codec,
)
from tokenizer_pipeline.demo.standin_corpus import build_corpus

pytestmark = pytest.mark.budget(
    60,
    reason="the first test builds the fitted demo codec: full-size encodec_32khz encodes 6,000 frames for the k-means fit",
)

CSV = REPO / "data" / "musiccaps" / "musiccaps-public.csv"
N_CLIPS, CLIP_S = 24, 5.0


@pytest.fixture(scope="session")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    corpus = tmp_path_factory.mktemp("codec_corpus")
    build_corpus(CSV, corpus, N_CLIPS, seed=0, duration_s=CLIP_S)
    files = corpus_files(corpus, N_CLIPS)
    model, latents = fit_demo_codec(files, seed=0, max_iter=10)
    out = tmp_path_factory.mktemp("codec")
    save_demo_codec(model, out)
    return {"corpus": corpus, "files": files, "model": model, "latents": latents, "out": out}


@pytest.fixture(scope="module")
def loaded(fitted: dict) -> tuple[EncodecModel, torch.Tensor]:
    """The saved codec loaded back as users load it, and its full-encode codes of the first clip ([K, T])."""
    model = EncodecModel.from_pretrained(fitted["out"]).eval()
    return model, encode_file(model, fitted["files"][0])


@pytest.mark.budget(120, reason="its setup fits the session's width-64 codec (k-means of 4 x 2048 codes)")
def test_config_is_encodec_32khz(fitted: dict) -> None:
    cfg = json.loads((fitted["out"] / "config.json").read_text())
    assert cfg["model_type"] == "encodec"
    expect = {
        "sampling_rate": 32000,
        "audio_channels": 1,
        "num_filters": 64,
        "upsampling_ratios": [8, 5, 4, 4],
        "target_bandwidths": [2.2],
        "codebook_size": 2048,
        "hidden_size": 128,
        "num_lstm_layers": 2,
        "norm_type": "weight_norm",
        "normalize": False,
        "use_causal_conv": False,
        "pad_mode": "reflect",
        "compress": 2,
        "use_conv_shortcut": False,
        "chunk_length_s": None,
        "overlap": None,
    }
    assert {k: cfg[k] for k in expect} == expect
    fe = EncodecFeatureExtractor.from_pretrained(fitted["out"])
    assert (fe.feature_size, fe.sampling_rate, fe.padding_value, fe.chunk_length_s) == (1, 32000, 0.0, None)


def test_roundtrip_from_pretrained(fitted: dict, loaded: tuple[EncodecModel, torch.Tensor]) -> None:
    model, disk = loaded  # disk: [K, T] codes of the first clip
    assert model.config.frame_rate == 50 and model.config.num_quantizers == 4
    assert model.config.normalize is False
    mem = encode_file(fitted["model"], fitted["files"][0])  # [K, T]
    assert mem.shape == (4, int(CLIP_S * 50))
    assert torch.equal(mem, disk)
    with torch.inference_mode():
        enc = model.encode(torch.zeros(1, 1, 32000))
    assert enc.audio_codes.shape == (1, 1, 4, 50)  # [chunks, B, K, T]
    assert all(s is None for s in enc.audio_scales)


def test_codes_not_degenerate(fitted: dict, loaded: tuple[EncodecModel, torch.Tensor]) -> None:
    model, first = loaded  # first: [K, T] full-encode codes of the first clip
    codes = quantize_latents(model, fitted["latents"])  # [N, K]
    assert codes.shape == (int(N_CLIPS * CLIP_S * 50), 4)
    for k, (distinct, entropy) in enumerate(code_stats(codes, 2048)):
        assert distinct >= 256, (k, distinct)
        # random init gives entropy 0; 6000 frames over 2048 centroids leave many singleton clusters whose
        # residual is exactly 0, so the deepest level is less spread here (~4.1 nats) than in `make codec` (~5.5)
        assert entropy > math.log(32), (k, entropy)
    # the full encode path agrees with the cached-latent path used for the statistics
    full = first.T.numpy()  # [K, T] -> [T, K]
    assert np.array_equal(full, codes[: full.shape[0]])


def test_unfitted_codec_is_degenerate(fitted: dict, tmp_path: Path) -> None:
    """Why the fit exists: random-init EncodecModel has all-zero codebooks, so every code is 0.

    Encodes the first second of a clip: with all-zero codebooks every input gives code 0, and a fitted
    codebook would give other codes within 50 frames as it does over the clip's 250."""
    audio, sr = sf.read(fitted["files"][0], dtype="float32")  # [N]
    sf.write(tmp_path / "first_second.wav", audio[:sr], sr)
    raw = build_random_model(seed=0)
    codes = encode_file(raw, tmp_path / "first_second.wav")  # [K, T]
    assert torch.unique(codes).tolist() == [0]
    assert all(int(cb.codebook.embed.abs().sum()) == 0 for cb in raw.quantizer.layers)


def test_deterministic_given_seed(fitted: dict) -> None:
    m1 = build_random_model(seed=0)
    a, b = m1.state_dict(), build_random_model(seed=0).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = build_random_model(seed=1).state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)
    # k-means on the same latents twice -> identical codebooks: the fixture's fit_demo_codec(seed=0, max_iter=10) ran
    # fit_codebooks on these latents once, this is the second run (on m1, whose weights were just compared)
    lat = torch.cat(fitted["latents"]).numpy()  # [N, D]
    fit_codebooks(m1, lat, seed=0, max_iter=10)
    for l1, lf in zip(m1.quantizer.layers, fitted["model"].quantizer.layers):
        assert torch.equal(l1.codebook.embed, lf.codebook.embed)
        cb = l1.codebook
        assert int(cb.cluster_size.sum()) == lat.shape[0]
        used = cb.cluster_size > 0
        torch.testing.assert_close(cb.embed_avg[used] / cb.cluster_size[used, None], cb.embed[used])


def test_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="make corpus"):
        corpus_files(tmp_path, 4)
    with pytest.raises(FileNotFoundError, match="make corpus"):
        corpus_files(tmp_path / "nope", 4)
    with pytest.raises(ValueError, match="--n-clips"):
        fit_codebooks(build_random_model(0), np.zeros((100, 128), np.float32), seed=0)


def test_saved_codec_files_follow_the_umask(fitted: dict, tmp_path: Path) -> None:
    """Others on a shared disk can read the codec: save_pretrained's model.safetensors (0600 from safetensors) gets
    the mode open() gives under the umask, as config.json has."""
    old = os.umask(0o027)
    try:
        save_demo_codec(fitted["model"], tmp_path / "codec")
    finally:
        os.umask(old)
    modes = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "codec").iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o640}, modes

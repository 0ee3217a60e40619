"""`python -m tokenizer_pipeline.codec_embeddings`: EnCodec encoder latents of wav files, one row per frame, equal to
the tiny codec's encoder run by hand; the sidecar names each clip's frames; refusals are one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from tokenizer_pipeline.audio.read_audio import resample
from tokenizer_pipeline.codec_embeddings import main


def write_wavs(d: Path, sr: int = 16_000) -> dict[str, np.ndarray]:
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    waves = {f"clip{i}": (0.3 * rng.normal(size=int(sr * s))).astype(np.float32) for i, s in enumerate((0.5, 0.8))}
    for key, w in waves.items():
        sf.write(d / f"{key}.wav", w, sr, subtype="FLOAT")
    return waves


def test_latents_equal_the_encoder_by_hand(tiny_codec: Path, tmp_path: Path) -> None:
    from transformers import EncodecModel

    waves = write_wavs(tmp_path / "wavs")  # 16 kHz: resampled to the codec's 32 kHz on read
    out = tmp_path / "emb" / "gen.npy"
    assert main([str(tmp_path / "wavs"), "--codec", str(tiny_codec), "--out", str(out)]) == 0
    emb = np.load(out)
    info = json.loads(out.with_suffix(".json").read_text())
    model = EncodecModel.from_pretrained(tiny_codec).eval()
    want = []
    with torch.no_grad():
        for key in sorted(waves):
            x = torch.from_numpy(resample(waves[key], 16_000, 32_000))[None, None]  # [1, 1, N]
            want.append(model.encoder(x)[0].T.numpy())  # [T, D]
    np.testing.assert_allclose(emb, np.concatenate(want), atol=1e-5)
    assert info["clips"] == [{"key": k, "frames": len(w)} for k, w in zip(sorted(waves), want)]
    assert info["dim"] == emb.shape[1] == model.config.hidden_size and info["frames"] == emb.shape[0]
    assert [c["frames"] for c in info["clips"]] == [25, 40]  # 0.5 s and 0.8 s at 50 frames/s


def test_refusals_are_one_line(tiny_codec: Path, tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path / "none"), "--codec", str(tiny_codec), "--out", str(tmp_path / "e.npy")]) == 2
    assert "holds no .wav files" in capsys.readouterr().err
    write_wavs(tmp_path / "wavs")
    assert main([str(tmp_path / "wavs"), "--codec", str(tmp_path / "nocodec"), "--out", str(tmp_path / "e.npy")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pass --codec" in err and not (tmp_path / "e.npy").exists()

"""EnCodec encoder latents of decoded clips (`python -m tokenizer_pipeline.codec_embeddings`), for a FAD on EnCodec
embeddings (fadtk's `encodec-emb`).

Each `<key>.wav` is read at the codec's rate (mono, soxr) and run through `EncodecModel.encoder`. Writes `<out>` (.npy,
float32 `[sum of frames, D]`, clips in key order) and `<out without .npy>.json` (codec, rates, D, each clip's frames).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from ..audio.read_audio import resample
from ..errors import UserError
from .encode import _local_model_dir, resolve_device


class CodecEmbeddingsError(UserError, ValueError):
    """No wavs, or a codec that is not available; the message names the path and the fix."""


def load_codec(name_or_path: str, device: torch.device):
    """EncodecModel from a directory or the local HF cache (no download), in eval mode."""
    from transformers import EncodecModel

    try:
        model_dir = _local_model_dir(name_or_path)
    except (OSError, ValueError) as e:
        raise CodecEmbeddingsError(
            f"codec {name_or_path!r} is neither a directory nor in the local Hugging Face cache "
            f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); pass --codec /path/to/the/codec/dir"
        ) from e
    return EncodecModel.from_pretrained(str(model_dir)).to(device).eval(), str(model_dir)


@torch.inference_mode()
def clip_latents(model, wave: np.ndarray, device: torch.device) -> np.ndarray:
    """mono float32 [N] at the codec's rate -> encoder latents [T, D] float32."""
    x = torch.from_numpy(wave)[None, None].to(device)  # [1, 1, N]
    if model.config.normalize:  # EncodecModel._encode_frame's scaling
        x = x / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + 1e-8)
    emb = model.encoder(x)  # [1, D, T]
    return emb[0].T.float().cpu().numpy()  # [D, T] -> [T, D]


def run(wav_dir: Path, codec: str, out: Path, device_name: str = "cpu") -> dict:
    """Write `out` (.npy, [frames, D]) and its .json sidecar; returns the sidecar's content."""
    wavs = sorted(wav_dir.glob("*.wav")) if wav_dir.is_dir() else []
    if not wavs:
        raise CodecEmbeddingsError(
            f"{wav_dir} holds no .wav files; decode clips first (python -m tokenizer_pipeline.decode <set> out_dir=...)"
        )
    if out.suffix != ".npy":
        raise CodecEmbeddingsError(f"--out {out} must end in .npy (its sidecar is written next to it as .json)")
    device = resolve_device(device_name)
    model, model_dir = load_codec(codec, device)
    sr = int(model.config.sampling_rate)
    parts, clips = [], []
    for path in wavs:
        audio, file_sr = sf.read(path, dtype="float32", always_2d=True)  # [N, C]
        lat = clip_latents(model, resample(audio.mean(axis=1), file_sr, sr), device)  # [T, D]
        parts.append(lat)
        clips.append({"key": path.stem, "frames": int(lat.shape[0])})
    emb = np.concatenate(parts).astype(np.float32)  # [sum T, D]
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, emb)
    info = {
        "codec": model_dir,
        "sampling_rate": sr,
        "frame_rate": float(model.config.frame_rate),
        "dim": int(emb.shape[1]),
        "frames": int(emb.shape[0]),
        "clips": clips,
    }
    out.with_suffix(".json").write_text(json.dumps(info, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return info

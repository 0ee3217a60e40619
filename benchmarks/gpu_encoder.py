"""bench_gpu.py's encoder figures, with nothing built beforehand: facebook/encodec_32khz's ARCHITECTURE with seeded
random weights, saved with save_pretrained into a temporary directory and loaded by tokenizer_pipeline's own
CodecEncoder (as the pipeline loads a codec), on seeded synthetic clips. Speed does not depend on the weights; the
share of bf16 codes equal to fp32's does (see AGREEMENT_MEANING).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

AGREEMENT_MEANING = {
    "random": "share of (clip, frame, codebook) codes where bf16 equals fp32, for the encodec_32khz ARCHITECTURE with "
    "seeded random weights (Gaussian codebooks fitted to the mean and std of its own latents): how often bf16 rounding "
    "flips a nearest-codeword choice of this untrained codec, not a figure of facebook/encodec_32khz's trained weights",
    "codec": "share of (clip, frame, codebook) codes where bf16 equals fp32, for the codec given by --codec",
}


def synthetic_clips(n: int, seconds: float, sampling_rate: int, seed: int) -> list[torch.Tensor]:
    """n seeded mono clips, each [N] float32 in [-1, 1]: three tones (55 Hz-4 kHz, log-uniform) over white noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(round(seconds * sampling_rate)) / sampling_rate  # [N] seconds
    clips = []
    for _ in range(n):
        freqs = 55 * (4000 / 55) ** torch.rand(3, 1, generator=g)  # [3, 1] Hz
        amps, phases = 0.1 + 0.2 * torch.rand(3, 1, generator=g), 2 * torch.pi * torch.rand(3, 1, generator=g)
        tones = (amps * torch.sin(2 * torch.pi * freqs * t + phases)).sum(0)  # [3, N] -> [N]
        clips.append((tones + 0.05 * torch.randn(t.shape, generator=g)).clamp(-1, 1))
    return clips


@torch.no_grad()
def seed_codebooks(model, wav: torch.Tensor, seed: int) -> None:
    """A random-init EncodecModel's codebooks are all zero (every code 0: bf16 would agree trivially). Codebook k
    becomes Gaussian draws with the per-dimension mean and std of what codebooks < k leave of the encoder's latents
    of `wav` [N]: codes then spread over hundreds of entries and depend on the audio, without the demo codec's
    k-means (random frames instead would collapse: a residual of frames that are themselves codewords is zero)."""
    g = torch.Generator().manual_seed(seed)
    param = next(model.parameters())
    residual = model.encoder(wav.view(1, 1, -1).to(param))[0].T  # [N] -> [1, 1, N] -> [1, D, T] -> [T, D]
    for layer in model.quantizer.layers[: model.config.num_quantizers]:
        cb = layer.codebook
        noise = torch.randn(cb.codebook_size, residual.shape[1], generator=g).to(residual)  # [C, D]
        embed = residual.mean(0) + residual.std(0) * noise  # [C, D]
        cb.embed.copy_(embed)
        cb.embed_avg.copy_(embed)
        cb.cluster_size.fill_(1.0)
        residual = residual - embed[cb.quantize(residual)]  # [T, D]


def random_encodec_32khz(out: Path, seed: int, device: torch.device, fit_s: float = 10.0) -> str:
    """facebook/encodec_32khz's architecture (tokenizer_pipeline's encodec_32khz_config: the values transformers'
    conversion script gives that checkpoint) with seeded random weights, codebooks from its latents of one synthetic
    `fit_s`-second clip (on `device`), saved into `out`; returns its path."""
    from transformers import EncodecModel

    from tokenizer_pipeline.demo.demo_codec import encodec_32khz_config

    torch.manual_seed(seed)
    config = encodec_32khz_config()
    model = EncodecModel(config).eval().to(device)
    seed_codebooks(model, synthetic_clips(1, fit_s, config.sampling_rate, seed + 1)[0], seed)
    model.save_pretrained(out)
    return str(out)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def encoder_speed(
    device: torch.device,
    codec: str | None,
    n_clips: int,
    clip_s: float,
    batch_size: int,
    fit_s: float = 41.0,
    seed: int = 0,
) -> dict:
    """CodecEncoder(path, device=..., dtype=...) in fp32 then bf16 on `n_clips` synthetic clips of `clip_s` seconds,
    `batch_size` clips per encode_batch call (one warm-up call first, not timed).

    `codec` None: random_encodec_32khz (codebooks from a `fit_s`-second clip) in a temporary directory. Returns
    audio-seconds/s and clips/s per dtype, the share of bf16 codes equal to fp32's (and what it means), and the
    codec's config as the encoder reports it.
    """
    from tokenizer_pipeline.codec.encode import CodecEncoder

    out: dict = {
        "codec": codec or f"encodec_32khz architecture, random weights (seed {seed})",
        "clips": n_clips,
        "clip_s": clip_s,
        "batch_size": batch_size,
        "audio": "synthetic: 3 tones + white noise per clip, seeded",
    }
    codes: dict[str, list[np.ndarray]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = codec or random_encodec_32khz(Path(tmp), seed, device, fit_s)
        for dtype in ("float32", "bfloat16"):
            enc = CodecEncoder(path, device=device.type, dtype=dtype)
            wavs = synthetic_clips(n_clips, clip_s, enc.sampling_rate, seed)  # n_clips x [N]
            enc.encode_batch(wavs[:batch_size])  # warm-up
            got: list[np.ndarray] = []
            _sync(device)
            t0 = time.perf_counter()
            for i in range(0, n_clips, batch_size):
                got.extend(enc.encode_batch(wavs[i : i + batch_size]))  # each [T, K] int16
            _sync(device)
            s = time.perf_counter() - t0
            codes[dtype] = got
            out[f"audio_s_per_s_{dtype}"] = n_clips * clip_s / s
            out[f"clips_per_s_{dtype}"] = n_clips / s
            out["config"] = {
                "sampling_rate": enc.sampling_rate,
                "frame_rate": enc.frame_rate,
                "bandwidth_kbps": enc.bandwidth_kbps,
                "n_codebooks": enc.n_codebooks,
                "codebook_size": enc.codebook_size,
                "codes_shape_per_clip": list(got[0].shape),  # [T, K]
                "identity": enc.config_identity,
            }
            del enc
            if device.type == "cuda":
                torch.cuda.empty_cache()
    fp32, bf16 = np.concatenate(codes["float32"]), np.concatenate(codes["bfloat16"])  # [sum T, K] each
    out["bf16_code_agreement"] = float((fp32 == bf16).mean())
    out["bf16_code_agreement_means"] = AGREEMENT_MEANING["codec" if codec else "random"]
    out["distinct_codes_fp32"] = [int(len(np.unique(fp32[:, k]))) for k in range(fp32.shape[1])]  # per codebook
    return out

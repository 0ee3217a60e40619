"""Embedded offline default, step 2: a demo codec with the `facebook/encodec_32khz` architecture and token layout.

The same `EncodecModel` config (its width, `num_filters`, may be narrower: 64 is encodec_32khz's, the demo uses a
narrower one to encode fast) with seeded random weights, whose residual quantizer is then fitted by k-means on the
random encoder's latents of stand-in clips (a random-init model has all-zero codebooks). Codes are non-degenerate and
audio-dependent; the decoder is untrained. `--out` holds `save_pretrained` files, `preprocessor_config.json` and
`DEMO_CODEC.md`.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.cluster import KMeans
from transformers import EncodecConfig, EncodecFeatureExtractor, EncodecModel

from tokenizer_pipeline.audio.read_audio import load_audio
from tokenizer_pipeline.errors import ConfigError, InputNotFoundError

SAMPLING_RATE = 32_000
KMEANS_MAX_ITER = 20  # Lloyd iterations per codebook; more = tighter codebooks, slower build
ENCODEC_32KHZ_NUM_FILTERS = 64  # facebook/encodec_32khz's width; a narrower demo codec keeps every other setting
DEMO_NOTE = """# Demo codec (stand-in, NOT a real codec)

This directory holds an `EncodecModel` with the `facebook/encodec_32khz` architecture and token layout
(32 kHz mono, 50 frames/s, 4 codebooks x 2048 codes at 2.2 kbps, `normalize=False`) at width `num_filters` {num_filters}
(encodec_32khz: 64), built offline by `python -m tokenizer_pipeline.demo_codec`:

- encoder/decoder weights: seeded random initialisation (seed {seed}), never trained;
- RVQ codebooks: fitted by k-means on the random encoder's latents of {n_clips} stand-in corpus clips
  (`{corpus}`), one residual level at a time, so codes are spread over the codebooks and depend on the audio.

Use it only to exercise the pipeline end to end. Codes from it are not comparable to real EnCodec codes,
and decoding them gives noise: decode quality is meaningless. For real data use `facebook/encodec_32khz`.

Fit summary over the fitting clips (frames: {n_frames}):

| codebook | distinct codes | entropy (nats) | max (ln 2048) |
| --- | --- | --- | --- |
{table}
"""


def encodec_32khz_config(num_filters: int = ENCODEC_32KHZ_NUM_FILTERS) -> EncodecConfig:
    """`EncodecConfig()` with the overrides transformers' convert_encodec_checkpoint_to_pytorch.py sets for
    `encodec_32khz` (`build_random_model` asserts the 50 frames/s x 4 codebooks they give); `num_filters` is the
    width of every conv (64 there), the one setting a narrower demo codec changes."""
    if num_filters < 1:
        raise ConfigError(f"num_filters must be >= 1 (encodec_32khz: {ENCODEC_32KHZ_NUM_FILTERS}), got {num_filters}")
    return EncodecConfig(
        upsampling_ratios=[8, 5, 4, 4],  # hop 640 samples -> 50 frames/s
        target_bandwidths=[2.2],
        num_filters=num_filters,
        sampling_rate=SAMPLING_RATE,
        codebook_size=2048,
        use_causal_conv=False,
        normalize=False,
        use_conv_shortcut=False,
    )


def build_random_model(seed: int, num_filters: int = ENCODEC_32KHZ_NUM_FILTERS) -> EncodecModel:
    """Seeded random-init EncodecModel (all-zero codebooks until `fit_codebooks`)."""
    torch.manual_seed(seed)
    model = EncodecModel(encodec_32khz_config(num_filters)).eval()
    assert model.config.frame_rate == 50 and model.config.num_quantizers == 4, (
        f"encodec_32khz must give 50 frames/s x 4 codebooks, got {model.config.frame_rate} x "
        f"{model.config.num_quantizers}"
    )
    return model


def corpus_files(corpus: Path, n_clips: int) -> list[Path]:
    """The first n_clips `*.wav` of the corpus directory, sorted by name."""
    if not corpus.is_dir():
        raise InputNotFoundError(f"stand-in corpus directory not found: {corpus}; run `make corpus` first")
    files = sorted(corpus.glob("*.wav"))
    if not files:
        raise InputNotFoundError(f"no .wav files in {corpus}; run `make corpus` first")
    if n_clips < 1:
        raise ConfigError(f"--n-clips must be >= 1, got {n_clips}")
    return files[:n_clips]


@torch.inference_mode()
def encode_latents(model: EncodecModel, files: list[Path]) -> list[torch.Tensor]:
    """Encoder latents per file, each [T, D] float32 (T = 50 per second, D = hidden_size)."""
    out = []
    for f in files:
        wav = load_audio(f, SAMPLING_RATE)  # [N]
        emb = model.encoder(wav.view(1, 1, -1))  # [N] -> [1, 1, N] -> [1, D, T]
        out.append(emb[0].T.contiguous())  # [1, D, T] -> [T, D]
    return out


def fit_codebooks(model: EncodecModel, latents: np.ndarray, seed: int, max_iter: int = KMEANS_MAX_ITER) -> None:
    """Residual k-means: codebook i is fitted on what codebooks 0..i-1 leave. latents: [N, D] float32."""
    n_q, size = model.config.num_quantizers, model.config.codebook_size
    if latents.shape[0] < size:
        raise ConfigError(f"{latents.shape[0]} latent frames cannot fit {size} centroids; use more clips (--n-clips)")
    residual = latents.astype(np.float32)  # [N, D]
    for i, layer in enumerate(model.quantizer.layers[:n_q]):
        # init on `size` distinct random frames: sklearn's k-means++ is slow for 2048 centroids
        rng = np.random.default_rng(seed + i)
        init = residual[np.sort(rng.choice(residual.shape[0], size=size, replace=False))]  # [C, D]
        km = KMeans(n_clusters=size, init=init, n_init=1, max_iter=max_iter, random_state=seed + i, algorithm="lloyd")
        km.fit(residual)
        embed = torch.from_numpy(km.cluster_centers_.astype(np.float32))  # [C, D]
        cb = layer.codebook
        counts = torch.from_numpy(np.bincount(km.labels_, minlength=size).astype(np.float32))  # [C]
        with torch.no_grad():
            cb.embed.copy_(embed)
            cb.embed_avg.copy_(embed * counts[:, None])  # EMA state consistent with embed = embed_avg / size
            cb.cluster_size.copy_(counts)
            cb.inited.fill_(1.0)
        # the quantizer's own assignment (not km.labels_) so the residual matches what encode() does
        idx = cb.quantize(torch.from_numpy(residual))  # [N]
        residual = residual - embed[idx].numpy()  # [N, D]


def code_stats(codes: np.ndarray, codebook_size: int) -> list[tuple[int, float]]:
    """(distinct codes, entropy in nats) per codebook. codes: [N, K]."""
    stats = []
    for k in range(codes.shape[1]):
        p = np.bincount(codes[:, k], minlength=codebook_size) / codes.shape[0]  # [C]
        p = p[p > 0]
        stats.append((int(p.size), float(-(p * np.log(p)).sum())))
    return stats


@torch.inference_mode()
def quantize_latents(model: EncodecModel, latents: list[torch.Tensor]) -> np.ndarray:
    """RVQ codes of cached latents, [sum T, K] int64 (same path as model.encode after the encoder)."""
    codes = [model.quantizer.encode(z.T[None], model.config.target_bandwidths[0]) for z in latents]  # [K, 1, T]
    return np.concatenate([c[:, 0].T.numpy() for c in codes])  # [K, 1, T] -> [T, K] -> [sum T, K]


@torch.inference_mode()
def encode_file(model: EncodecModel, path: Path) -> torch.Tensor:
    """Full `model.encode` of one file, the way the pipeline calls it. Returns [K, T] codes."""
    wav = load_audio(path, SAMPLING_RATE)  # [N]
    enc = model.encode(wav.view(1, 1, -1), bandwidth=model.config.target_bandwidths[0])
    if any(s is not None for s in enc.audio_scales):
        raise RuntimeError("demo codec must have normalize=False (audio_scales None); got scales")
    return enc.audio_codes[0, 0]  # [chunks=1, B=1, K, T] -> [K, T]


def fit_demo_codec(
    files: list[Path], seed: int = 0, max_iter: int = KMEANS_MAX_ITER, num_filters: int = ENCODEC_32KHZ_NUM_FILTERS
) -> tuple[EncodecModel, list[torch.Tensor]]:
    """Seeded random EncodecModel with RVQ codebooks fitted on `files`. Returns (model, latents n x [T, D])."""
    model = build_random_model(seed, num_filters)
    latents = encode_latents(model, files)  # n x [T, D]
    fit_codebooks(model, torch.cat(latents).numpy(), seed, max_iter)  # [sum T, D]
    return model, latents


def save_demo_codec(model: EncodecModel, out: Path) -> None:
    """save_pretrained the model and the encodec_32khz feature extractor into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    EncodecFeatureExtractor(
        feature_size=1, sampling_rate=SAMPLING_RATE, padding_value=0.0, chunk_length_s=None, overlap=None
    ).save_pretrained(out)
    # save_pretrained writes model.safetensors through safetensors' private temporary file: mode 0600 whatever the
    # umask. Give every file the mode open() gives (0o666 & ~umask), so others on a shared disk can read the codec.
    mask = os.umask(0)
    os.umask(mask)  # os.umask reads the mask only by setting it
    for f in out.iterdir():
        if f.is_file() and not f.is_symlink():
            f.chmod(0o666 & ~mask)


def build_demo_codec(
    corpus: Path,
    out: Path,
    n_clips: int,
    seed: int = 0,
    max_iter: int = KMEANS_MAX_ITER,
    num_filters: int = ENCODEC_32KHZ_NUM_FILTERS,
) -> dict:
    """Build, fit, save, reload and summarise the demo codec. Returns the summary dict."""
    files = corpus_files(corpus, n_clips)
    t0 = time.perf_counter()
    model, latents = fit_demo_codec(files, seed, max_iter, num_filters)
    t_fit = time.perf_counter() - t0
    mem_codes = quantize_latents(model, latents)  # [N, K]
    save_demo_codec(model, out)

    # Load back the way users load facebook/encodec_32khz, and check it tokenises identically.
    loaded = EncodecModel.from_pretrained(out).eval()
    if loaded.config.normalize or loaded.config.num_quantizers != 4 or loaded.config.frame_rate != 50:
        raise RuntimeError(f"reloaded codec config is not encodec_32khz-like: {loaded.config}")
    codes = quantize_latents(loaded, latents)  # [N, K]
    if not np.array_equal(codes, mem_codes):
        raise RuntimeError(f"codes from EncodecModel.from_pretrained({out}) differ from the in-memory model")
    full = encode_file(loaded, files[0]).T.numpy()  # [K, T] -> [T, K]
    if not np.array_equal(full, mem_codes[: full.shape[0]]):
        raise RuntimeError(f"loaded model.encode({files[0].name}) differs from the fitted codes")

    stats = code_stats(codes, loaded.config.codebook_size)
    table = "\n".join(
        f"| {k} | {d} | {h:.3f} | {math.log(loaded.config.codebook_size):.3f} |" for k, (d, h) in enumerate(stats)
    )
    (out / "DEMO_CODEC.md").write_text(
        DEMO_NOTE.format(
            seed=seed,
            num_filters=num_filters,
            n_clips=len(files),
            corpus=corpus.name,
            n_frames=codes.shape[0],
            table=table,
        ),
        encoding="utf-8",
    )
    n_params = sum(p.numel() for p in loaded.parameters())
    return {"n_clips": len(files), "n_frames": int(codes.shape[0]), "stats": stats, "fit_s": t_fit, "params": n_params}

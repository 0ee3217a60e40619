"""Codes held in memory -> waveforms in the calling process: `tokenizer_pipeline.decode_codes(codes, codec=...)`.

`codec` names the codec the codes belong to: its directory or Hub id (the local Hugging Face cache, as
`python -m tokenizer_pipeline.decode` reads it), or a dict with `path` and/or `name_or_path` (tried in that order) and
what to check the codec against, each where present: `weights_sha256`, `config` (the identity fields), `n_codebooks`,
`codebook_size`, `sampling_rate`. A manifest's `codec` block has these keys; so does adapter_trainer's
`MoTAdapter.codec`. Each row decodes alone, as the decode command decodes a clip (`decode.decode_clip`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .decode import DecodeError, decode_clip, load_checked_codec
from .encode import resolve_device

PAD_CODE = -1  # the frames after a row's end (a generated clip that stopped early, in a batch padded to one T)


def _candidates(codec: str | os.PathLike | dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """(the record to check against, (name, where it came from) to try in order)."""
    if isinstance(codec, (str, os.PathLike)):
        return {}, [(str(codec), "codec=")]
    if not isinstance(codec, dict):
        raise DecodeError(
            f"codec={type(codec).__name__}: pass a codec directory or Hub id, or a dict with path / name_or_path "
            f"(e.g. MoTAdapter.codec or a manifest's codec block)"
        )
    tries = [(str(codec[k]), f"codec[{k!r}]") for k in ("path", "name_or_path") if codec.get(k)]
    if not tries:
        raise DecodeError(f"codec dict with keys {sorted(codec)} names no codec: give it 'path' or 'name_or_path'")
    return codec, tries


def _rows(codes: Any) -> tuple[np.ndarray, bool]:
    """codes [B, K, T] or [K, T] (a torch tensor or array of integers) -> (int64 [B, K, T], whether it had a batch)."""
    if hasattr(codes, "detach"):  # a torch tensor, on any device
        codes = codes.detach().cpu().numpy()
    arr = np.asarray(codes)
    if arr.ndim not in (2, 3) or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise DecodeError(
            f"codes {arr.dtype} {list(arr.shape)}: decode_codes takes integer codes [B, K, T] or [K, T] with T > 0 "
            f"(as MoTAdapter.generate returns them)"
        )
    return (arr if arr.ndim == 3 else arr[None]).astype(np.int64), arr.ndim == 3


def _lengths(codes: np.ndarray, K: int, C: int, name: str) -> list[int]:
    """Each row's frames before its PAD_CODE tail; DecodeError for codes this codec cannot decode."""
    B, k, T = codes.shape
    if k != K:
        raise DecodeError(f"codes have {k} codebooks (shape [B, K, T] = {list(codes.shape)}), codec {name} has {K}")
    lo, hi = int(codes.min()), int(codes.max())
    if lo < PAD_CODE or hi >= C:
        raise DecodeError(f"code values in [{lo}, {hi}], codec {name} has codes 0..{C - 1} ({PAD_CODE}: after the end)")
    lengths = []
    for b in range(B):
        pad = (codes[b] == PAD_CODE).any(0)  # [T] frames holding a pad
        n = int(np.argmax(pad)) if pad.any() else T
        if n == 0 or (codes[b, :, n:] != PAD_CODE).any():
            raise DecodeError(
                f"codes row {b}: {PAD_CODE} marks a row's end and fills every codebook of each frame after it; this "
                f"row has {'no frame before it' if n == 0 else 'codes after it'}"
            )
        lengths.append(n)
    return lengths


def decode_codes(
    codes: Any, *, codec: str | os.PathLike | dict[str, Any], device: str = "cpu"
) -> tuple[np.ndarray, int]:
    """codes int [B, K, T] or [K, T] (torch or numpy) -> (waveforms float32 [B, N] or [N], sampling_rate).

    N = T x the codec's hop: a row that ends early (PAD_CODE frames after its codes) is zero-padded to N. The codec's
    weights must hash to codec['weights_sha256'] when given. DecodeError (one line) for codes or a codec that do not
    fit. device: cpu (default), auto, cuda or mps.
    """
    info, tries = _candidates(codec)
    batch, batched = _rows(codes)
    dev = resolve_device(device)
    model, codec_dir, _ = load_checked_codec(
        info,
        tries,
        dev,
        missing="the codec given as codec= is not available here",
        record=("codec['weights_sha256'] records", "codec"),
        fix="Pass the codec these codes belong to (e.g. codec=MoTAdapter.codec)",
    )
    cfg, quantizer = model.config, model.quantizer
    allowed = sorted({int(quantizer.get_num_quantizers_for_bandwidth(float(bw))) for bw in cfg.target_bandwidths})
    K = int(info["n_codebooks"]) if "n_codebooks" in info else batch.shape[1]
    if K not in allowed:
        raise DecodeError(f"codec {codec_dir} decodes {allowed} codebooks, not {K}: pass the codec the codes belong to")
    lengths = _lengths(batch, K, int(cfg.codebook_size), codec_dir)
    hop = int(np.prod(cfg.upsampling_ratios))
    wavs = [decode_clip(model, batch[b, :, :n].T, dev) for b, n in enumerate(lengths)]  # [N_b] each
    N = max(batch.shape[2] * hop, *(len(w) for w in wavs))
    out = np.zeros((len(wavs), N), np.float32)  # [B, N]
    for b, w in enumerate(wavs):
        out[b, : len(w)] = w
    return (out if batched else out[0]), int(cfg.sampling_rate)

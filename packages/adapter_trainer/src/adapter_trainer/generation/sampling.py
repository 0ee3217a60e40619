"""Sampling audio codes from a MoT adapter: KV-cached decoding, classifier-free guidance, top-k / top-p.

    prefill   [BOS, caption..., AUDIO_START]   (left-padded; with CFG also [BOS, AUDIO_START] rows = empty caption)
    step s    logits of the last position -> CFG -> per-head masks -> temperature -> top-k -> top-p -> sample
              -> feed the sampled position (J slots) back through `model.forward_step` with the KV cache

CFG as audiocraft's `LMModel._sample_next_token`: both branches continue with the same sampled tokens, logits mixed
as `uncond + cfg_scale * (cond - uncond)`. AUDIO_END and the layouts as training lays them out (token_layout). Each
step stays on the device (the host reads the rows' state every `stop_check_every` steps); row b's uniforms come from
its own generator seeded by `row_seeds[b]`, so a clip's sample does not depend on its batch.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from adapter_trainer.data.token_layout import AudioVocab, decode_audio_tokens, n_slots


@dataclass
class SamplingConfig:
    temperature: float = 1.0  # <= 0: greedy (argmax)
    top_k: int = 250  # MusicGen's default; 0 = off
    top_p: float = 0.0  # nucleus mass; 0 = off
    cfg_scale: float = 3.0  # MusicGen's default; 1.0 = no guidance (no unconditioned rows)


class StepModel(Protocol):
    """What the sampler needs from a model (mot.MoTAdapterModel.forward_step). A model may also offer
    `decode_step(tokens [B, 1, J], attention_mask, cache)` (MoTAdapterModel's): forward_step for one audio position
    per row without host syncs; the decoding steps use it when present."""

    def forward_step(
        self, tokens: torch.Tensor, is_audio: torch.Tensor, attention_mask: torch.Tensor, cache: object | None
    ) -> tuple[torch.Tensor, object]:
        """tokens [B, S_new, J], is_audio [B, S_new], attention_mask [B, S_past + S_new] -> logits [B, S_new, H, size]."""
        ...


@dataclass
class GenerationResult:
    codes: list[np.ndarray]  # per row: int16 [T_b, K] raw codes (the shard layout)
    ended: list[bool]  # True where the model sampled AUDIO_END, False where max_frames stopped it
    steps: int  # decoding steps run (audio positions per row, the longest row)
    seconds: float  # wall time of prefill + decoding
    positions_per_s: float  # rows * steps / seconds (conditioned rows only; CFG doubles the compute)
    invalid_draws: list[int] = field(default_factory=list)  # per row: draws `draw` replaced (0 in a healthy run)


def apply_cfg(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """MusicGen's classifier-free guidance on raw logits: uncond + scale * (cond - uncond)."""
    return uncond + scale * (cond - uncond)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [..., V] -> same shape, -inf outside the top-k / top-p nucleus (transformers' TopK then TopP warpers:
    top-k keeps ties with the k-th value; top-p the smallest sorted prefix whose mass reaches top_p)."""
    out = logits.clone()
    V = out.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]  # [..., 1]
        out = out.masked_fill(out < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)  # [..., V]
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(-1) - probs  # [..., V] mass of the strictly better tokens
        drop_sorted = mass_before >= top_p  # keep the smallest prefix whose mass reaches top_p (at least one token)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def warp(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """logits [..., V] -> temperature, then top-k, then top-p (transformers' and audiocraft's order), as float32."""
    logits = logits.float()
    if cfg.temperature > 0:
        logits = logits / cfg.temperature
    return filter_logits(logits, cfg.top_k, cfg.top_p)


def row_uniforms(generators: list[torch.Generator], n_steps: int, n_heads: int) -> torch.Tensor:
    """uniforms [B, n_steps, n_heads] in [0, 1): row b's from generators[b] only, drawn once per batch on the CPU."""
    return torch.stack([torch.rand(n_steps, n_heads, generator=g) for g in generators])  # [B, n_steps, H]


def _cdf(probs: torch.Tensor) -> torch.Tensor:
    """probs [..., V] -> running sums [..., V] (one seam: tests inject the rounding a parallel scan may make)."""
    return probs.cumsum(-1)


def draw(logits: torch.Tensor, cfg: SamplingConfig, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_rows`, plus invalid [B, H] bool: the draw landed on an id whose warped logit is not finite.

    Such a draw takes the head's best allowed id instead, so a sample is never an id the step forbids. It happens
    with NaN logits, or when CUDA's parallel cumsum makes the cdf over a zero-probability tail not exactly monotone.
    """
    logits = warp(logits, cfg)  # [B, H, V] float32
    if cfg.temperature <= 0:
        idx = logits.argmax(-1)  # [B, H]
    else:
        cdf = _cdf(torch.softmax(logits, dim=-1))  # [B, H, V]
        target = (uniforms.to(cdf.dtype) * cdf[..., -1])[..., None]  # [B, H, 1]
        idx = torch.searchsorted(cdf, target, right=True)[..., 0].clamp(max=logits.shape[-1] - 1)  # [B, H]
    invalid = ~torch.isfinite(logits.gather(-1, idx[..., None])[..., 0])  # [B, H]
    lowest = torch.finfo(logits.dtype).min
    best = logits.nan_to_num(nan=lowest, posinf=float("inf"), neginf=float("-inf")).argmax(-1)  # [B, H]
    return torch.where(invalid, best, idx), invalid


def sample_rows(logits: torch.Tensor, cfg: SamplingConfig, uniforms: torch.Tensor) -> torch.Tensor:
    """logits [B, H, V] (disallowed entries -inf), uniforms [B, H] -> indices [B, H]: inverse-CDF sampling, the first
    index whose cumulative probability exceeds u * total; never an id whose warped logit is -inf or NaN (`draw`)."""
    return draw(logits, cfg, uniforms)[0]


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths -> ids [B, P] left-padded with pad_id, mask [B, P] (True = real token)."""
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)  # [B, P]
    mask = torch.zeros((len(prompts), P), dtype=torch.bool)  # [B, P]
    for b, p in enumerate(prompts):
        if p:
            ids[b, P - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[b, P - len(p) :] = True
    return ids, mask


@torch.inference_mode()
def generate_codes(
    model: StepModel,
    captions: list[list[int]],  # caption token ids per row, WITHOUT BOS (already truncated)
    *,
    vocab: AudioVocab,
    pattern: str,
    bos_id: int,
    pad_id: int,
    max_frames: int,
    sampling: SamplingConfig,
    row_seeds: list[int],
    device: torch.device | str = "cpu",
    new_cache: Callable[[int], object] | None = None,
    stop_check_every: int = 16,
) -> GenerationResult:
    """Sample codes [T_b, K] int16 (1 <= T_b <= max_frames) for every caption; a row stops at AUDIO_END or max_frames.

    `new_cache(max_len)` makes the empty KV cache the prefill starts from (e.g. `MoTKVCache.allocate`); None lets
    forward_step make its own.
    """
    if not captions:
        raise ValueError("generate_codes got no captions")
    if len(row_seeds) != len(captions):
        raise ValueError(f"{len(row_seeds)} row_seeds for {len(captions)} captions; give one seed per caption")
    if max_frames < 1:
        raise ValueError(f"max_frames={max_frames} must be >= 1 (raise generate.seconds)")
    K, C, V = vocab.n_codebooks, vocab.codebook_size, vocab.text_vocab_size
    J = n_slots(pattern, K)
    H = K if pattern == "delay" else 1
    B = len(captions)
    use_cfg = sampling.cfg_scale != 1.0
    prompts = [[bos_id, *c, vocab.audio_start] for c in captions]
    if use_cfg:
        prompts += [[bos_id, vocab.audio_start]] * B  # the empty caption that caption dropout trained
    ids, prompt_mask = left_pad(prompts, pad_id)  # [R, P], [R, P]; R = B or 2B
    R, P = ids.shape
    # delay: T + K - 1 steps, plus the END step when K = 1; flatten: T*K codes plus END
    total_steps = max_frames + max(K - 1, 1) if pattern == "delay" else max_frames * K + 1
    tokens = ids[..., None].expand(R, P, J).to(device)  # [R, P, J]: text ids repeat in every slot
    is_audio = (ids >= V).to(device)  # [R, P]: only AUDIO_START
    mask = torch.ones((R, P + total_steps), dtype=torch.bool, device=device)  # [R, P + steps]; a view per step
    mask[:, :P] = prompt_mask.to(device)
    step_is_audio = torch.ones((R, 1), dtype=torch.bool, device=device)  # [R, 1]
    uniforms = row_uniforms([torch.Generator().manual_seed(int(s)) for s in row_seeds], total_steps, H).to(
        device
    )  # [B, steps, H]

    # Allowed entries of the heads per step kind (device constants), END column last.
    size = C + 1 if pattern == "delay" else K * C + 1
    slot = torch.arange(K, device=device)  # [K]
    # delay: [codes only, codes + END on head 0] ("no frame `step`, stop here"; from step 1 on).
    # flatten: step % K = k proposes codebook k; END only at a frame boundary (k = 0), after >= 1 frame.
    allowed_codes = torch.zeros((K if pattern == "flatten" else 1, H, size), dtype=torch.bool, device=device)
    if pattern == "delay":
        allowed_codes[0, :, :C] = True  # [1, K, C + 1]
    else:
        for k in range(K):
            allowed_codes[k, 0, k * C : (k + 1) * C] = True  # [K, 1, K*C + 1]
    allowed_end = allowed_codes[0].clone()  # [H, size]
    allowed_end[0, size - 1] = True

    # Per-row state on the device. frames[b] = T_b once known (END sampled or max_frames reached), else -1.
    frames = torch.full((B,), -1, dtype=torch.long, device=device)  # [B]
    ended = torch.zeros((B,), dtype=torch.bool, device=device)  # [B]
    audio = torch.full((B, total_steps, J), vocab.audio_pad, dtype=torch.long, device=device)  # [B, steps, J]
    code_offset = V + C * slot  # [K] first id of codebook k
    n_invalid = torch.zeros((B,), dtype=torch.long, device=device)  # [B] draws `draw` had to replace
    cache = new_cache(P + total_steps) if new_cache is not None else None

    decode_step = getattr(model, "decode_step", None)  # optional (StepModel): forward_step serves otherwise
    t0 = time.perf_counter()
    logits, cache = model.forward_step(tokens, is_audio, mask[:, :P], cache)  # [R, P, H, size]
    for step in range(total_steps):
        last = logits[:, -1].float()  # [R, H, size]
        guided = apply_cfg(last[:B], last[B:], sampling.cfg_scale) if use_cfg else last  # [B, H, size]
        kind = step % K if pattern == "flatten" else 0
        allowed = allowed_end if kind == 0 and step >= 1 else allowed_codes[kind]  # [H, size]
        drawn, invalid = draw(guided.masked_fill(~allowed, float("-inf")), sampling, uniforms[:, step])  # [B, H]

        active = frames < 0  # [B] rows whose length is still open
        n_invalid += (invalid.any(-1) & active).long()  # [B], on the device
        if pattern == "delay":
            end_now = active & ((drawn[:, 0] == C) | (step >= max_frames))  # [B]
            sampled_end = end_now & (drawn[:, 0] == C)
            ended |= sampled_end
            frames = torch.where(end_now, torch.full_like(frames, step), frames)
            T = torch.where(frames >= 0, frames, torch.full_like(frames, step + 1))  # [B] frames so far
            frame_of = step - slot  # [K] frame whose codebook k this step carries
            has_code = (frame_of >= 0)[None] & (frame_of[None] < T[:, None])  # [B, K]
            new = torch.where(has_code, code_offset + drawn.clamp(max=C - 1), vocab.audio_pad)  # [B, K]
            # the clip's end: END in slot 0 of step T (token_layout); slots k >= 1 keep finishing the tail
            new[:, 0] = torch.where(sampled_end, vocab.audio_end, new[:, 0])
        else:
            idx, k = drawn[:, 0], step % K  # [B]
            end_now = active & ((idx == K * C) | ((k == 0) & (step >= max_frames * K)))  # [B]
            sampled_end = end_now & (idx == K * C)
            ended |= sampled_end
            frames = torch.where(end_now, torch.full_like(frames, step // K), frames)
            new = torch.where(active & ~end_now, V + idx, vocab.audio_pad)[:, None]  # [B, 1]
            new = torch.where(sampled_end[:, None], vocab.audio_end, new)  # END where the clip ends (token_layout)
        audio[:, step] = new
        if step == total_steps - 1:
            break
        if (step + 1) % stop_check_every == 0 and bool(_finished(frames, ended, step, pattern, K).all()):
            break  # the one host read of these steps
        feed = torch.cat([new, new], dim=0) if use_cfg else new  # [R, J]: both CFG branches get the same tokens
        if decode_step is not None:  # the model's sync-free path for one audio position per row
            logits, cache = decode_step(feed[:, None], mask[:, : P + step + 1], cache)  # [R, 1, H, size]
        else:
            logits, cache = model.forward_step(
                feed[:, None], step_is_audio, mask[:, : P + step + 1], cache
            )  # [R, 1, H, size]

    frames = torch.where(frames >= 0, frames, torch.full_like(frames, max_frames))  # flatten rows that ran out
    n_steps = _recorded_steps(frames, ended, pattern, K)  # [B] audio positions of each row
    audio_host, n_host, ended_host = audio.cpu(), n_steps.cpu().tolist(), ended.cpu().tolist()  # the end-of-batch read
    invalid_host = n_invalid.cpu().tolist()
    if any(invalid_host):
        warnings.warn(
            f"generate_codes: {sum(invalid_host)} draws (per row {invalid_host}) landed on a non-finite logit and took "
            f"the best allowed id instead; NaN logits mean a broken model or precision (trainer.precision, model.dtype)",
            stacklevel=2,
        )
    seconds = time.perf_counter() - t0
    codes = [
        decode_audio_tokens(audio_host[b, : n_host[b]], vocab=vocab, pattern=pattern)  # [T_b, K] int16
        for b in range(B)
    ]
    steps = max(n_host)
    return GenerationResult(
        codes=codes,
        ended=[bool(e) for e in ended_host],
        steps=steps,
        seconds=seconds,
        positions_per_s=B * steps / max(seconds, 1e-9),
        invalid_draws=invalid_host,
    )


def _recorded_steps(frames: torch.Tensor, ended: torch.Tensor, pattern: str, K: int) -> torch.Tensor:
    """[B] audio positions of each row once its length `frames` [B] is known (token_layout.audio_steps)."""
    if pattern == "delay":  # T + K - 1 (with END: T + max(K - 1, 1))
        return frames + K - 1 + (ended & (K == 1)).long()
    return frames * K + ended.long()  # T*K codes (+ END)


def _finished(frames: torch.Tensor, ended: torch.Tensor, step: int, pattern: str, K: int) -> torch.Tensor:
    """[B] bool: the row's length is known and every one of its positions up to `step` is written."""
    return (frames >= 0) & (_recorded_steps(frames.clamp(min=0), ended, pattern, K) <= step + 1)

"""Sampling audio codes from a MoT adapter: KV-cached decoding, classifier-free guidance, top-k / top-p.

One `generate_codes` call samples a batch of clips, one audio position per step:

    prefill   [BOS, caption..., AUDIO_START]   (left-padded; with CFG also [BOS, AUDIO_START] rows = empty caption)
    step s    logits of the last position -> CFG -> per-head masks -> temperature / top-k / top-p -> sample
              -> feed the sampled position (J slots) back through `model.forward_step` with the KV cache

CFG as MusicGen does it (audiocraft `LMModel._sample_next_token`): the batch holds the conditioned rows and
the same rows with an empty caption, both continue with the SAME sampled tokens, and the raw logits are
mixed as `uncond + cfg_scale * (cond - uncond)` (cfg_scale = 1 switches the unconditioned rows off).

Layouts (token_layout): delay -> step s carries slot k = code of frame s - k (AUDIO_PAD where s - k is outside
[0, T)); flatten -> step s carries code (s % K) of frame s // K. Stopping: head 0 (delay) / a frame boundary
(flatten) may sample AUDIO_END, or the clip reaches `max_frames`; a delayed row then finishes its last K - 1
steps with pads forced into the slots that are done, exactly the tail `DelayPattern.build` writes.

Reproducible: every row draws from its own `torch.Generator` seeded by `row_seeds[b]`, so a clip's sample does
not depend on which other clips share its batch (up to float differences in batched logits).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
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
    """What the sampler needs from a model (mot.MoTAdapterModel.forward_step)."""

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


def apply_cfg(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """MusicGen's classifier-free guidance on raw logits: uncond + scale * (cond - uncond)."""
    return uncond + scale * (cond - uncond)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [..., V] -> same shape with everything outside the top-k / top-p nucleus set to -inf."""
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


def sample_rows(logits: torch.Tensor, cfg: SamplingConfig, generators: list[torch.Generator]) -> torch.Tensor:
    """logits [B, H, V] (disallowed entries already -inf) -> sampled indices [B, H], row b drawn with generators[b]."""
    logits = filter_logits(logits.float().cpu(), cfg.top_k, cfg.top_p)  # [B, H, V]
    if cfg.temperature <= 0:
        return logits.argmax(-1)  # [B, H]
    probs = torch.softmax(logits / cfg.temperature, dim=-1)  # [B, H, V]
    return torch.stack([torch.multinomial(probs[b], 1, generator=g)[:, 0] for b, g in enumerate(generators)])  # [B, H]


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
) -> GenerationResult:
    """Sample codes for every caption; stops per row at AUDIO_END or `max_frames` frames.

    Returns:
        GenerationResult with codes [T_b, K] int16 per row (1 <= T_b <= max_frames).
    """
    if not captions:
        raise ValueError("generate_codes got no captions")
    if len(row_seeds) != len(captions):
        raise ValueError(f"{len(row_seeds)} row_seeds for {len(captions)} captions; give one seed per caption")
    if max_frames < 1:
        raise ValueError(f"max_frames={max_frames} must be >= 1 (raise generate.seconds)")
    K, C, V = vocab.n_codebooks, vocab.codebook_size, vocab.text_vocab_size
    J = n_slots(pattern, K)
    B = len(captions)
    use_cfg = sampling.cfg_scale != 1.0
    prompts = [[bos_id, *c, vocab.audio_start] for c in captions]
    if use_cfg:
        prompts += [[bos_id, vocab.audio_start]] * B  # the empty caption that caption dropout trained
    ids, mask = left_pad(prompts, pad_id)  # [R, P], [R, P]; R = B or 2B
    R = ids.shape[0]
    tokens = ids[..., None].expand(R, ids.shape[1], J).to(device)  # [R, P, J]: text ids repeat in every slot
    is_audio = (ids >= V).to(device)  # [R, P]: only AUDIO_START
    mask = mask.to(device)
    generators = [torch.Generator().manual_seed(int(s)) for s in row_seeds]

    # Per-row state. frames[b] = T_b once known (END sampled or max_frames reached), else -1.
    frames = [-1] * B
    ended = [False] * B
    audio: list[list[torch.Tensor]] = [[] for _ in range(B)]  # per row: [J] id tensors, one per step
    total_steps = max_frames + K - 1 if pattern == "delay" else max_frames * K

    t0 = time.perf_counter()
    logits, cache = model.forward_step(tokens, is_audio, mask, None)  # [R, P, H, size]
    step = 0
    for step in range(total_steps):
        last = logits[:, -1].float()  # [R, H, size]
        guided = apply_cfg(last[:B], last[B:], sampling.cfg_scale) if use_cfg else last  # [B, H, size]
        allowed = torch.zeros_like(guided, dtype=torch.bool)  # [B, H, size]
        if pattern == "delay":
            # head k proposes code of frame step - k (+ END on head 0 only: "no frame `step`, stop here")
            for k in range(K):
                allowed[:, k, :C] = True
            allowed[:, 0, C] = step >= 1
        else:
            k = step % K
            allowed[:, 0, k * C : (k + 1) * C] = True
            allowed[:, 0, K * C] = k == 0 and step >= 1  # END only at a frame boundary, after >= 1 frame
        drawn = sample_rows(guided.masked_fill(~allowed, float("-inf")), sampling, generators)  # [B, H]

        new = torch.full((B, J), vocab.audio_pad, dtype=torch.long)  # [B, J] next position's ids
        for b in range(B):
            if pattern == "delay":
                if frames[b] < 0 and (int(drawn[b, 0]) == C or step >= max_frames):
                    frames[b], ended[b] = step, int(drawn[b, 0]) == C
                T = frames[b] if frames[b] >= 0 else step + 1
                for k in range(K):
                    if 0 <= step - k < T:
                        new[b, k] = vocab.code_id(k, int(drawn[b, k]))
                if frames[b] < 0 or step < frames[b] + K - 1:
                    audio[b].append(new[b])
            else:
                if frames[b] >= 0:
                    continue
                idx, k = int(drawn[b, 0]), step % K
                if idx == K * C or (k == 0 and step >= max_frames * K):
                    frames[b], ended[b] = step // K, idx == K * C
                    continue
                new[b, 0] = V + idx
                audio[b].append(new[b])
        if all(f >= 0 for f in frames) and all(
            len(audio[b]) >= (frames[b] + K - 1 if pattern == "delay" else frames[b] * K) for b in range(B)
        ):
            break
        feed = torch.cat([new, new], dim=0) if use_cfg else new  # [R, J]: both CFG branches get the same tokens
        mask = torch.cat([mask, torch.ones((R, 1), dtype=torch.bool, device=mask.device)], dim=1)  # [R, S + 1]
        logits, cache = model.forward_step(
            feed[:, None].to(device), torch.ones((R, 1), dtype=torch.bool, device=device), mask, cache
        )  # [R, 1, H, size]
    seconds = time.perf_counter() - t0

    codes = []
    for b in range(B):
        if frames[b] < 0:  # flatten rows that ran to the last step without sampling END
            frames[b] = max_frames
        seq = torch.stack(audio[b])  # [S_b, J]
        codes.append(decode_audio_tokens(seq, vocab=vocab, pattern=pattern))  # [T_b, K] int16
    steps = step + 1
    return GenerationResult(
        codes=codes, ended=ended, steps=steps, seconds=seconds, positions_per_s=B * steps / max(seconds, 1e-9)
    )

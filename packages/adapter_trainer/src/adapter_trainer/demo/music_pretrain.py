"""Pretrain the tiny demo MusicGen as an unconditional music LM on the train split of a shard set.

Stands in for what facebook/musicgen-small brings to a real run: a frozen music LM that already knows how music
continues, whose code tables and heads the adapter starts from (`audio_embed_init/audio_head_init: musicgen`). It
reads codes from shards only (stage 2 never builds a codec) and only the TRAIN split: the held-out eval clips the
learning check scores are never trained on.

It trains `MusicgenForCausalLM` the way transformers' MusicGen reads its inputs: each window is MusicGen's own delay
pattern (`build_delay_pattern_mask` over BOS + codes: position 0 is BOS = id C in every codebook, codebook k is
delayed by k + 1 positions, the triangles before and after are pad = C), inputs are the pattern without its last
position and labels the pattern without its first; MusicGen's loss ignores labels equal to its pad id, so the
triangles and the right padding of shorter clips are never targets. No text conditioning (no encoder states).

Deterministic: seeded init, window draws and batch order; one intra-op thread (restored afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm
from transformers import MusicgenForCausalLM

from adapter_trainer.data.samples import Clip
from adapter_trainer.demo.pretrain import optimizer_step, set_lr


@dataclass
class MusicPretrainConfig:
    steps: int = 1500  # optimizer steps; 1500 x 8 windows = 12.5 epochs of the demo's 960 train clips (~3 CPU min)
    batch_size: int = 8  # windows per step
    max_frames: int = 250  # window length in frames (5 s at 50 Hz); a longer clip gives a random crop of it
    lr: float = 3e-3  # peak AdamW lr (tiny model)
    warmup_steps: int = 50
    weight_decay: float = 0.01  # >= 2-D weights except the code embeddings
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "max_frames", "warmup_steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(
                    f"MusicPretrainConfig.{name}={getattr(self, name)} must be >= 1 (e.g. --music-pretrain-steps 1500)"
                )


@dataclass
class MusicPretrainReport:
    split: str  # the split trained on
    n_clips: int  # its clips
    n_frames: int  # their code frames (what the windows are drawn from)
    first_loss: float  # nats/code, first step (MusicGen's loss: the mean over codebooks of each one's mean CE)
    final_loss: float  # nats/code, mean of the last 50 steps
    eval_split: str | None  # the held-out split scored after training (never trained on), or None
    eval_clips: int  # its clips (scored from their first frame, windows of max_frames)
    eval_ce: float | None  # nats/code over every code target of those windows


def delay_pattern_windows(model: MusicgenForCausalLM, windows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Code windows -> MusicGen's (input_ids [B*K, S], labels [B, S, K]) with S = max(T) + K - 1.

    Each window [T, K] becomes `build_delay_pattern_mask` of BOS + codes (T + K positions); inputs drop its last
    position, labels its first, so labels[p] is the id at position p + 1. Shorter windows are right-padded with the
    pad id, which MusicGen's loss ignores like the pattern's own triangles.
    """
    cfg = model.config
    K, pad, bos = cfg.num_codebooks, cfg.pad_token_id, cfg.bos_token_id
    S = max(w.shape[0] for w in windows) + K - 1
    patterns = []
    for w in windows:
        T = w.shape[0]
        codes = torch.from_numpy(np.ascontiguousarray(w.T, dtype=np.int64))  # [K, T]
        prompt = torch.cat([torch.full((K, 1), bos, dtype=torch.long), codes], dim=1)  # [K, 1 + T]
        # its second output is the whole pattern (the first stops where the prompt's codebook 0 does); below
        # 2K - 1 positions it returns no pattern at all, so a clip of fewer than K - 1 frames gets a longer one, cut
        # back: the cells after a codebook's last code that the longer pattern left open (-1) are pad there
        length = max(T + K, 2 * K - 1)
        _, pattern = model.build_delay_pattern_mask(prompt, pad_token_id=pad, max_length=length)
        pattern = pattern[:, : T + K].masked_fill(pattern[:, : T + K] < 0, pad)  # [K, T + K]
        patterns.append(torch.nn.functional.pad(pattern, (0, S + 1 - pattern.shape[1]), value=pad))  # [K, S + 1]
    full = torch.stack(patterns)  # [B, K, S + 1]
    input_ids = full[:, :, :-1].reshape(-1, S)  # [B*K, S]
    labels = full[:, :, 1:].transpose(1, 2).contiguous()  # [B, S, K]
    return input_ids, labels


def music_lm_loss(model: MusicgenForCausalLM, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """MusicGen's own training loss (`model(input_ids, labels=labels).loss`: per codebook the mean CE over labels
    that are not its pad id, averaged over codebooks), computed head by head.

    Equal to transformers' (tested); written out because transformers stacks the K heads' logits and selects each
    codebook back out, whose backward fills a zero [B, K, S, C] tensor per codebook: 30% of a demo step on CPU.
    """
    hidden = model.model(input_ids=input_ids).last_hidden_state  # [B, S, d]
    target = labels.masked_fill(labels == model.config.pad_token_id, -100)  # [B, S, K]
    per_codebook = [
        torch.nn.functional.cross_entropy(head(hidden).flatten(0, 1), target[..., k].reshape(-1))
        for k, head in enumerate(model.lm_heads)
    ]  # K x [] mean CE over that codebook's targets
    return torch.stack(per_codebook).mean()


def _windows(clips: list[Clip], max_frames: int, rng: np.random.Generator, *, first: bool) -> list[np.ndarray]:
    """One window per clip: its first `max_frames` frames (first=True) or a random crop of that length."""
    out = []
    for clip in clips:
        T = clip.codes.shape[0]
        start = 0 if first or max_frames >= T else int(rng.integers(0, T - max_frames + 1))
        out.append(clip.codes[start : start + max_frames].astype(np.int64))  # [<=max_frames, K]
    return out


@torch.no_grad()
def held_out_ce(model: MusicgenForCausalLM, clips: list[Clip], max_frames: int, batch_size: int = 16) -> float:
    """MusicGen's CE (nats per code target) on each clip's first window, every code target weighted alike."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(clips), batch_size):
        input_ids, labels = delay_pattern_windows(
            model, _windows(clips[i : i + batch_size], max_frames, None, first=True)
        )
        logits = model(input_ids=input_ids).logits  # [B*K, S, C]
        B, S, K = labels.shape
        logits = logits.reshape(B, K, S, -1).transpose(1, 2)  # [B, S, K, C]
        target = labels.masked_fill(labels == model.config.pad_token_id, -100)  # [B, S, K]
        ce = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum"
        )
        total += float(ce)
        count += int((target != -100).sum())
    return total / max(count, 1)


def pretrain_music_lm(
    model: MusicgenForCausalLM,
    train: list[Clip],
    cfg: MusicPretrainConfig,
    *,
    eval_clips: list[Clip] | None = None,
    split: str = "train",
    eval_split: str | None = None,
    progress: bool = True,
) -> MusicPretrainReport:
    """Train `model` in place as an unconditional music LM on `train` (codes [T, K] of 0..C-1); left in eval()."""
    if not train:
        raise ValueError(f"no clips in the {split!r} split to pretrain the music LM on")
    K, C = model.config.num_codebooks, model.config.vocab_size
    for clip in train:
        if clip.codes.ndim != 2 or clip.codes.shape[1] != K or clip.codes.size == 0:
            raise ValueError(f"clip {clip.key!r}: codes {clip.codes.shape}, the music LM needs [T >= 1, {K}]")
        if int(clip.codes.max()) >= C or int(clip.codes.min()) < 0:
            raise ValueError(f"clip {clip.key!r}: codes outside 0..{C - 1} (the music LM's codebook size)")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # determinism and a fair share of a shared CPU
    try:
        losses = _train(model, train, cfg, progress)
        ce = held_out_ce(model, eval_clips, cfg.max_frames) if eval_clips else None
    finally:
        torch.set_num_threads(threads)
    model.eval()
    tail = losses[-50:]
    return MusicPretrainReport(
        split=split,
        n_clips=len(train),
        n_frames=sum(int(c.codes.shape[0]) for c in train),
        first_loss=losses[0],
        final_loss=sum(tail) / len(tail),
        eval_split=eval_split if eval_clips else None,
        eval_clips=len(eval_clips or []),
        eval_ce=ce,
    )


def _train(model: MusicgenForCausalLM, train: list[Clip], cfg: MusicPretrainConfig, progress: bool) -> list[float]:
    torch.manual_seed(cfg.seed)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed_tokens" not in n]
    other = [p for n, p in model.named_parameters() if p.ndim < 2 or "embed_tokens" in n]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    rng = np.random.default_rng(cfg.seed)
    order, start = rng.permutation(len(train)), 0
    losses: list[float] = []
    bar = tqdm(range(cfg.steps), desc="pretrain demo MusicGen on train codes", disable=not progress, unit="step")
    for step in bar:
        set_lr(opt, cfg.lr, step, cfg.warmup_steps, cfg.steps)
        if start + cfg.batch_size > len(train):  # epoch boundary: reshuffle (a split smaller than a batch: all)
            order, start = rng.permutation(len(train)), 0
        batch = [train[int(i)] for i in order[start : start + cfg.batch_size]]
        start += cfg.batch_size
        input_ids, labels = delay_pattern_windows(model, _windows(batch, cfg.max_frames, rng, first=False))
        losses.append(optimizer_step(music_lm_loss(model, input_ids, labels), model, opt))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses

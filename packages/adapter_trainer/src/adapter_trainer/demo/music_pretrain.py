"""Pretrain the tiny demo MusicGen on a shard set's TRAIN split, conditionally, the way musicgen-small was.

With a `MusicgenTeacher`, each caption goes through the frozen T5, then `enc_to_dec_proj` (trained) into every
layer's cross-attention; condition dropout gives a row MusicGen's null. Without a teacher it trains
unconditionally. Inputs are MusicGen's own delay pattern; pad-id labels are never targets. Deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm import tqdm
from transformers import MusicgenForCausalLM

from adapter_trainer.data.samples import Clip
from adapter_trainer.demo.pretrain import optimizer_step, set_lr
from adapter_trainer.model.teacher import MusicgenTeacher


@dataclass
class MusicPretrainConfig:
    steps: int = 1000  # optimizer steps (about 8 epochs of the demo's 960 train clips)
    batch_size: int = 8  # sequences per step
    max_frames: int = 250  # sequence length in frames (5 s at 50 Hz); a longer clip gives a random crop of it
    lr: float = 3e-3  # peak AdamW lr (tiny model)
    warmup_steps: int = 50
    weight_decay: float = 0.01  # >= 2-D weights except the code embeddings
    cond_dropout: float = 0.3  # conditional runs: share of rows trained on the null condition (audiocraft's rate)
    seed: int = 0
    threads: int = 1  # torch intra-op threads (the same weights come back for the same count, on the same machine)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "max_frames", "warmup_steps", "threads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(
                    f"MusicPretrainConfig.{name}={getattr(self, name)} must be >= 1 (e.g. --music-pretrain-steps 1500)"
                )
        if not 0.0 <= self.cond_dropout < 1.0:
            raise ValueError(
                f"MusicPretrainConfig.cond_dropout={self.cond_dropout} must be in [0, 1) (audiocraft: 0.3)"
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
    eval_ce: float | None  # nats/code over every code target of those windows (conditional: with their own captions)
    conditional: bool = False  # trained with the clips' captions through the text encoder (else unconditionally)
    n_captions: int = 0  # distinct captions of the split trained on (conditional runs)
    eval_ce_null: float | None = None  # conditional runs: the same targets under MusicGen's null condition


def delay_pattern_windows(model: MusicgenForCausalLM, windows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Code windows [T, K] -> MusicGen's (input_ids [B*K, S], labels [B, S, K]), S = max(T) + K - 1, right-padded
    with the pad id."""
    cfg = model.config
    K, pad, bos = cfg.num_codebooks, cfg.pad_token_id, cfg.bos_token_id
    S = max(w.shape[0] for w in windows) + K - 1
    patterns = []
    for w in windows:
        T = w.shape[0]
        codes = torch.from_numpy(np.ascontiguousarray(w.T, dtype=np.int64))  # [K, T]
        prompt = torch.cat([torch.full((K, 1), bos, dtype=torch.long), codes], dim=1)  # [K, 1 + T]
        # below 2K - 1 positions it returns no pattern: a short clip gets a longer one, cut back (open cells -> pad)
        length = max(T + K, 2 * K - 1)
        _, pattern = model.build_delay_pattern_mask(prompt, pad_token_id=pad, max_length=length)
        pattern = pattern[:, : T + K].masked_fill(pattern[:, : T + K] < 0, pad)  # [K, T + K]
        patterns.append(torch.nn.functional.pad(pattern, (0, S + 1 - pattern.shape[1]), value=pad))  # [K, S + 1]
    full = torch.stack(patterns)  # [B, K, S + 1]
    input_ids = full[:, :, :-1].reshape(-1, S)  # [B*K, S]
    labels = full[:, :, 1:].transpose(1, 2).contiguous()  # [B, S, K]
    return input_ids, labels


def music_lm_loss(
    model: MusicgenForCausalLM,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    encoder_hidden_states: torch.Tensor | None = None,
    encoder_attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """MusicGen's own training loss (per codebook the mean CE over non-pad labels, averaged over codebooks), head by
    head; the condition (states [B, T, d], mask [B, T]) goes to every cross-attention. Equal to transformers' (tested),
    without its stacked logits, whose backward fills a zero [B, K, S, C] tensor per codebook."""
    hidden = model.model(
        input_ids=input_ids, encoder_hidden_states=encoder_hidden_states, encoder_attention_mask=encoder_attention_mask
    ).last_hidden_state  # [B, S, d]
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


class CaptionStates:
    """Each distinct caption's frozen T5 states, computed once with `MusicgenTeacher.encode_text` (64 at a time), so a
    training step only runs the projection. `batch` pads them back into the [B, T] layout `encode_text` gives a batch
    (states 0 and mask 0 past a caption's end), a dropped row or an empty caption with mask 0 everywhere."""

    def __init__(self, teacher: MusicgenTeacher, captions: list[str], chunk: int = 64) -> None:
        self.width = teacher.text_encoder.config.d_model
        self.states: dict[str, torch.Tensor | None] = {}  # caption -> [n, d_text], None for the null (empty caption)
        distinct = sorted(set(captions), key=lambda t: (len(t), t))  # similar lengths share a chunk: less padding
        for i in range(0, len(distinct), chunk):
            texts = distinct[i : i + chunk]
            states, mask = teacher.encode_text(texts, "cpu")  # [b, T, d_text], [b, T]
            for text, row, m in zip(texts, states, mask):
                n = int(m.sum())
                self.states[text] = row[:n].clone() if n else None

    def batch(self, captions: list[str], keep: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (T5 states [B, T, d_text], mask [B, T] long) for `MusicgenTeacher.project`; keep=False: the null."""
        rows = [self.states[c] if k else None for c, k in zip(captions, keep)]
        T = max((r.shape[0] for r in rows if r is not None), default=1)
        states = torch.zeros(len(rows), T, self.width)
        mask = torch.zeros(len(rows), T, dtype=torch.long)
        for b, r in enumerate(rows):
            if r is not None:
                states[b, : r.shape[0]] = r
                mask[b, : r.shape[0]] = 1
        return states, mask


@torch.no_grad()
def held_out_ce(
    model: MusicgenForCausalLM,
    clips: list[Clip],
    max_frames: int,
    batch_size: int = 16,
    teacher: MusicgenTeacher | None = None,
    null: bool = False,
) -> float:
    """MusicGen's CE (nats per code target) on each clip's first window, every code target weighted alike.

    With `teacher` (whose decoder is `model`): conditioned by `MusicgenTeacher.condition` on each clip's caption, or
    on MusicGen's null (null=True); without, no cross-attention input at all."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(clips), batch_size):
        batch = clips[i : i + batch_size]
        input_ids, labels = delay_pattern_windows(model, _windows(batch, max_frames, None, first=True))
        cond = {}
        if teacher is not None:
            states, mask = teacher.condition(["" if null else c.caption for c in batch], input_ids.device)
            cond = {"encoder_hidden_states": states, "encoder_attention_mask": mask}
        logits = model(input_ids=input_ids, **cond).logits  # [B*K, S, C]
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
    teacher: MusicgenTeacher | None = None,
    eval_clips: list[Clip] | None = None,
    split: str = "train",
    eval_split: str | None = None,
    progress: bool = True,
) -> MusicPretrainReport:
    """Train `model` in place as a music LM on `train` (codes [T, K]); left in eval(). With `teacher` (whose decoder
    is `model`) conditioned on the captions, the report holding the held-out CE with them and with the null."""
    if not train:
        raise ValueError(f"no clips in the {split!r} split to pretrain the music LM on")
    if teacher is not None and teacher.decoder is not model:
        raise ValueError("the teacher's decoder must be the model being pretrained")
    K, C = model.config.num_codebooks, model.config.vocab_size
    for clip in train:
        if clip.codes.ndim != 2 or clip.codes.shape[1] != K or clip.codes.size == 0:
            raise ValueError(f"clip {clip.key!r}: codes {clip.codes.shape}, the music LM needs [T >= 1, {K}]")
        if int(clip.codes.max()) >= C or int(clip.codes.min()) < 0:
            raise ValueError(f"clip {clip.key!r}: codes outside 0..{C - 1} (the music LM's codebook size)")
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)  # a recorded setting: floats depend on the thread count
    try:
        losses = _train(model, train, cfg, progress, teacher)
        ce = held_out_ce(model, eval_clips, cfg.max_frames, teacher=teacher) if eval_clips else None
        null = (
            held_out_ce(model, eval_clips, cfg.max_frames, teacher=teacher, null=True)
            if eval_clips and teacher
            else None
        )
    finally:
        torch.set_num_threads(threads)
    model.eval()
    if teacher is not None:
        teacher.eval()
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
        conditional=teacher is not None,
        n_captions=len({c.caption for c in train}) if teacher is not None else 0,
        eval_ce_null=null,
    )


def _train(
    model: MusicgenForCausalLM,
    train: list[Clip],
    cfg: MusicPretrainConfig,
    progress: bool,
    teacher: MusicgenTeacher | None,
) -> list[float]:
    torch.manual_seed(cfg.seed)
    trained = nn.ModuleDict({"decoder": model})  # what the optimizer steps and the grad-norm clip sees
    captions = None
    if teacher is not None:
        teacher.text_encoder.eval()
        captions = CaptionStates(teacher, [c.caption for c in train])
        if teacher.enc_to_dec_proj is not None:
            trained["enc_to_dec_proj"] = teacher.enc_to_dec_proj.requires_grad_(True)
    trained.train()
    decay = [p for n, p in trained.named_parameters() if p.ndim >= 2 and "embed_tokens" not in n]
    other = [p for n, p in trained.named_parameters() if p.ndim < 2 or "embed_tokens" in n]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    rng = np.random.default_rng(cfg.seed)
    order, start = rng.permutation(len(train)), 0
    losses: list[float] = []
    what = "train codes and captions" if teacher is not None else "train codes"
    bar = tqdm(range(cfg.steps), desc=f"pretrain demo MusicGen on {what}", disable=not progress, unit="step")
    for step in bar:
        set_lr(opt, cfg.lr, step, cfg.warmup_steps, cfg.steps)
        if start + cfg.batch_size > len(train):  # epoch boundary: reshuffle (a split smaller than a batch: all)
            order, start = rng.permutation(len(train)), 0
        batch = [train[int(i)] for i in order[start : start + cfg.batch_size]]
        start += cfg.batch_size
        input_ids, labels = delay_pattern_windows(model, _windows(batch, cfg.max_frames, rng, first=False))
        cond = {}
        if captions is not None:
            keep = (rng.random(len(batch)) >= cfg.cond_dropout).tolist()  # False: this row sees the null condition
            states, mask = teacher.project(*captions.batch([c.caption for c in batch], keep))
            cond = {"encoder_hidden_states": states, "encoder_attention_mask": mask}
        losses.append(optimizer_step(music_lm_loss(model, input_ids, labels, **cond), trained, opt))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses

"""Pretrain the tiny demo Llama on MusicCaps captions NOT in the demo corpus (held-out numbers stay held-out).

Deterministic. Training runs on a copy whose vocabulary is only the ids in the captions, written back into the full
tied table afterwards: the same as a softmax restricted to those ids, without the full table's optimizer state.
"""

from __future__ import annotations

import copy
import csv
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase


@dataclass
class PretrainConfig:
    steps: int = 200  # optimizer steps
    batch_size: int = 24  # captions per step
    max_tokens: int = 50  # BOS + caption + EOS, truncated (the demo keeps 48 caption tokens: data.max_caption_tokens)
    lr: float = 3e-3  # peak AdamW lr (tiny model)
    warmup_steps: int = 20
    seed: int = 0


@dataclass
class PretrainReport:
    n_captions: int  # captions trained on (after excluding the corpus's ytids)
    n_token_ids: int  # distinct ids in the softmax
    first_loss: float  # nats/token, first step
    final_loss: float  # nats/token, mean of the last 20 steps


def set_lr(opt: torch.optim.Optimizer, peak: float, step: int, warmup_steps: int, steps: int) -> None:
    """The demo pretrainings' schedule: linear warmup, then cosine from `peak` to 0.1 x peak over `steps`."""
    lr = peak * min(1.0, (step + 1) / warmup_steps) * (0.55 + 0.45 * math.cos(math.pi * step / steps))
    for group in opt.param_groups:
        group["lr"] = lr


def optimizer_step(loss: torch.Tensor, model: torch.nn.Module, opt: torch.optim.Optimizer) -> float:
    """Backward, clip the global grad norm at 1, AdamW step; returns the loss as a float."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def read_captions(csv_path: Path, exclude_csv: Path | None) -> tuple[list[str], int]:
    """Captions of `csv_path` (MusicCaps CSV) whose ytid is not in `exclude_csv` -> (captions, n_excluded)."""
    exclude: set[str] = set()
    if exclude_csv is not None:
        with open(exclude_csv, newline="") as f:
            exclude = {row["ytid"] for row in csv.DictReader(f)}
        if not exclude:
            raise ValueError(f"{exclude_csv} lists no ytid: pass the demo corpus's musiccaps-subset.csv (make corpus)")
    captions, n_excluded = [], 0
    with open(csv_path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if "ytid" not in row or "caption" not in row:
                raise ValueError(f"{csv_path} row {i + 2}: needs 'ytid' and 'caption' columns (MusicCaps CSV layout)")
            if row["ytid"] in exclude:
                n_excluded += 1
            elif row["caption"].strip():
                captions.append(row["caption"].strip())
    return captions, n_excluded


def pretrain_on_captions(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    captions: list[str],
    cfg: PretrainConfig,
    progress: bool = True,
) -> PretrainReport:
    """Train `model` in place as a causal LM on `captions` (BOS caption EOS); returns the loss summary."""
    if not captions:
        raise ValueError("no captions to pretrain on (every CSV row excluded?)")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # determinism and a fair share of a shared CPU
    try:
        return _pretrain(model, tokenizer, captions, cfg, progress)
    finally:
        torch.set_num_threads(threads)


def _pretrain(model, tokenizer, captions, cfg: PretrainConfig, progress: bool) -> PretrainReport:
    eos = tokenizer.eos_token_id
    ids = [tokenizer(c)["input_ids"][: cfg.max_tokens - 1] + [eos] for c in captions]  # BOS ... EOS
    used = torch.tensor(sorted({t for seq in ids for t in seq}))  # [U] global ids that occur
    to_local = torch.full((model.config.vocab_size,), -1, dtype=torch.long)  # global id -> local id
    to_local[used] = torch.arange(len(used))
    local_ids = [to_local[torch.tensor(seq)] for seq in ids]  # each [n] in [0, U)

    torch.manual_seed(cfg.seed)
    small_cfg = copy.deepcopy(model.config)
    small_cfg.vocab_size = len(used)
    small = LlamaForCausalLM(small_cfg)
    state = model.state_dict()
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"][used]  # [U, D]
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied (Llama 3.2 1B ties them too)
    small.load_state_dict(state)
    small.train()
    decay = [p for n, p in small.named_parameters() if p.ndim >= 2 and "embed" not in n]
    other = [p for n, p in small.named_parameters() if p.ndim < 2 or "embed" in n]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95)
    )
    g = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(ids), generator=g)
    losses: list[float] = []
    bar = tqdm(range(cfg.steps), desc="pretrain demo LLM on captions", disable=not progress, unit="step")
    start = 0
    for step in bar:
        set_lr(opt, cfg.lr, step, cfg.warmup_steps, cfg.steps)
        if start + cfg.batch_size > len(ids):  # epoch boundary: reshuffle
            order, start = torch.randperm(len(ids), generator=g), 0
        batch = [local_ids[int(i)] for i in order[start : start + cfg.batch_size]]
        start += cfg.batch_size
        S = max(len(t) for t in batch)
        x = torch.zeros((len(batch), S), dtype=torch.long)  # [B, S] right-padded
        mask = torch.zeros((len(batch), S), dtype=torch.long)  # [B, S]
        for b, t in enumerate(batch):
            x[b, : len(t)] = t
            mask[b, : len(t)] = 1
        labels = x.masked_fill(mask == 0, -100)  # [B, S]; HF shifts them inside
        losses.append(optimizer_step(small(input_ids=x, attention_mask=mask, labels=labels).loss, small, opt))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")

    trained = small.state_dict()
    with torch.no_grad():
        full = model.state_dict()
        for name, t in trained.items():
            if name in ("model.embed_tokens.weight", "lm_head.weight"):
                continue
            full[name].copy_(t)
        model.model.embed_tokens.weight[used] = trained["model.embed_tokens.weight"]  # lm_head is tied to it
    model.eval()
    return PretrainReport(
        n_captions=len(ids),
        n_token_ids=len(used),
        first_loss=losses[0],
        final_loss=sum(losses[-20:]) / len(losses[-20:]),
    )

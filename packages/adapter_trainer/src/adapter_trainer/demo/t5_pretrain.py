"""Pretrain the demo MusicGen's tiny T5 encoder on captions with T5's own objective, span corruption.

musicgen-small reads captions through a pretrained T5; this gives the demo's teacher the same kind of text path.
Around the encoder a tiny T5 decoder (`T5ForConditionalGeneration` at `tiny_t5_encoder_config`'s sizes) learns to
write back the spans that sentinels (`<extra_id_N>`) replace in its input, as T5 was pretrained (15% noise, mean span
3); the decoder is then dropped and the encoder's weights written back. Span corruption rather than a masked-token
head on the encoder: it fits the demo's time budget, and its decoder reads the encoder through cross-attention, as
MusicGen's decoder does. A seeded slice of captions is held out and scored before and after training on the same
corruption. Deterministic given the seed (one thread, as pretrain.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase, T5Config, T5EncoderModel, T5ForConditionalGeneration

from adapter_trainer.demo.pretrain import optimizer_step, set_lr
from adapter_trainer.demo.text_encoder import T5_EXTRA_IDS

IGNORE = -100  # label id the loss skips (transformers' convention)


@dataclass
class T5PretrainConfig:
    steps: int = 0  # optimizer steps (0: the encoder keeps its random init, which reads captions better: results.md)
    batch_size: int = 16  # captions per step
    noise_density: float = 0.15  # share of each caption's tokens hidden in spans (T5's)
    mean_span: float = 3.0  # mean noise-span length in tokens (T5's)
    lr: float = 3e-3  # peak AdamW lr (tiny model)
    warmup_steps: int = 20
    heldout: int = 64  # captions kept out of training and scored (at most a quarter of them)
    max_tokens: int = 128  # caption tokens kept (longer ones truncated before corruption)
    seed: int = 0

    def __post_init__(self) -> None:
        if int(self.steps) < 0:
            raise ValueError(f"T5PretrainConfig.steps={self.steps} must be >= 0 (e.g. --t5-pretrain-steps 225)")
        for name in ("batch_size", "warmup_steps", "max_tokens"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"T5PretrainConfig.{name}={getattr(self, name)} must be >= 1")
        if int(self.heldout) < 0:
            raise ValueError(f"T5PretrainConfig.heldout={self.heldout} must be >= 0")
        if not 0.0 < self.noise_density < 1.0 or self.mean_span < 1.0:
            raise ValueError(
                f"T5PretrainConfig: noise_density={self.noise_density} must be in (0, 1) and mean_span="
                f"{self.mean_span} >= 1 (T5: 0.15 and 3)"
            )


@dataclass
class T5PretrainReport:
    n_captions: int  # captions trained on
    n_heldout: int  # captions held out and scored
    first_loss: float | None  # nats per target token, first step (None: no step)
    final_loss: float | None  # nats per target token, mean of the last 20 steps
    heldout_loss_init: float | None  # held-out captions' loss with the random-init encoder and decoder
    heldout_loss: float | None  # the same targets after training


def span_corrupt(
    ids: list[int], sentinels: list[int], eos: int, cfg: T5PretrainConfig, g: torch.Generator
) -> tuple[list[int], list[int]]:
    """T5's span corruption of one caption's ids (no `</s>`) -> (encoder input, decoder target), each closed by
    `eos`: kept and noise runs alternate, kept first; the k-th noise span becomes `sentinels[k]` in the input, and the
    target lists each sentinel followed by the span it hides."""
    n = len(ids)
    n_noise = min(max(1, round(n * cfg.noise_density)), max(n - 1, 1))
    n_spans = max(1, min(round(n_noise / cfg.mean_span), n - n_noise, len(sentinels)))
    noise, kept = _partition(n_noise, n_spans, g), _partition(n - n_noise, n_spans, g)
    inp, tgt, pos = [], [], 0
    for k in range(n_spans):
        inp += ids[pos : pos + kept[k]]
        pos += kept[k]
        inp.append(sentinels[k])
        tgt += [sentinels[k], *ids[pos : pos + noise[k]]]
        pos += noise[k]
    return inp + [eos], tgt + [eos]


def _partition(total: int, parts: int, g: torch.Generator) -> list[int]:
    """`total` split into `parts` runs at random cuts (each >= 1 when total >= parts; [0] for 0 in one part)."""
    if parts == 1:
        return [total]
    cuts = sorted((torch.randperm(total - 1, generator=g)[: parts - 1] + 1).tolist())
    return [b - a for a, b in zip([0, *cuts], [*cuts, total])]


def pretrain_t5_encoder(
    encoder: T5EncoderModel,
    tokenizer: PreTrainedTokenizerBase,
    captions: list[str],
    cfg: T5PretrainConfig,
    progress: bool = True,
) -> T5PretrainReport:
    """Train `encoder` in place by span corruption on `captions` (less a held-out slice); left in eval() and frozen."""
    sentinels = tokenizer.convert_tokens_to_ids([f"<extra_id_{k}>" for k in range(T5_EXTRA_IDS)])
    if tokenizer.unk_token_id in sentinels:
        raise ValueError(
            "the T5 tokenizer has no <extra_id_N> sentinels: build it with text_encoder.train_t5_tokenizer"
        )
    captions = [c for c in captions if c.strip()]
    if not captions:
        raise ValueError("no captions to pretrain the demo T5 on (every CSV row excluded?)")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # determinism and a fair share of a shared CPU
    try:
        return _pretrain(encoder, tokenizer, captions, sentinels, cfg, progress)
    finally:
        torch.set_num_threads(threads)


def _pretrain(encoder, tokenizer, captions, sentinels, cfg: T5PretrainConfig, progress: bool) -> T5PretrainReport:
    eos = tokenizer.eos_token_id
    ids = [tokenizer(c, add_special_tokens=False)["input_ids"][: cfg.max_tokens] for c in captions]
    ids = [seq for seq in ids if seq]
    g = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(ids), generator=g).tolist()
    n_held = min(cfg.heldout, len(ids) // 4)
    held = [ids[i] for i in order[:n_held]]
    train = [ids[i] for i in order[n_held:]]
    held_g = torch.Generator().manual_seed(cfg.seed + 1)  # one fixed corruption, scored before and after
    held_pairs = [span_corrupt(seq, sentinels, eos, cfg, held_g) for seq in held]

    model = _with_decoder(encoder, cfg.seed)
    before = _heldout_loss(model, held_pairs) if held_pairs else None
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "shared" not in n]
    other = [p for n, p in model.named_parameters() if p.ndim < 2 or "shared" in n]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95)
    )
    batch_size = min(cfg.batch_size, len(train))
    losses: list[float] = []
    epoch: list[list[int]] = []
    bar = tqdm(range(cfg.steps), desc="pretrain demo T5 on captions", disable=not progress, unit="step")
    model.train()
    for step in bar:
        set_lr(opt, cfg.lr, step, cfg.warmup_steps, cfg.steps)
        if not epoch:
            epoch = _length_sorted_batches(train, batch_size, g)
        pairs = [span_corrupt(train[i], sentinels, eos, cfg, g) for i in epoch.pop(0)]
        losses.append(optimizer_step(model(**_collate(pairs)).loss, model, opt))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    after = _heldout_loss(model, held_pairs) if held_pairs and cfg.steps else before
    state = model.state_dict()
    encoder.load_state_dict({k: v for k, v in state.items() if k.startswith(("shared.", "encoder."))})
    encoder.eval().requires_grad_(False)
    tail = losses[-20:]
    return T5PretrainReport(
        n_captions=len(train),
        n_heldout=len(held),
        first_loss=losses[0] if losses else None,
        final_loss=sum(tail) / len(tail) if tail else None,
        heldout_loss_init=before,
        heldout_loss=after,
    )


def _with_decoder(encoder: T5EncoderModel, seed: int) -> T5ForConditionalGeneration:
    """A T5ForConditionalGeneration of the encoder's sizes (decoder as deep), holding a copy of its weights."""
    d = encoder.config.to_dict()
    d.update(is_encoder_decoder=True, num_decoder_layers=encoder.config.num_layers, decoder_start_token_id=0)
    torch.manual_seed(seed + 3)  # the decoder's init
    model = T5ForConditionalGeneration(T5Config(**d))
    missing = model.load_state_dict(encoder.state_dict(), strict=False).missing_keys
    if not all(k.startswith(("decoder.", "lm_head.")) for k in missing):
        raise RuntimeError(f"the encoder's weights do not fill T5ForConditionalGeneration's encoder: {missing[:4]}")
    return model


def _length_sorted_batches(train: list[list[int]], batch_size: int, g: torch.Generator) -> list[list[int]]:
    """One epoch of batches: a shuffle, cut into pools of 8 batches, each pool sorted by length (less padding)."""
    order = torch.randperm(len(train), generator=g).tolist()
    pool = 8 * batch_size
    batches = []
    for p in range(0, len(order) - batch_size + 1, pool):
        chunk = sorted(order[p : p + pool], key=lambda i: (len(train[i]), i))
        batches += [chunk[b : b + batch_size] for b in range(0, len(chunk) - batch_size + 1, batch_size)]
    return [batches[int(i)] for i in torch.randperm(len(batches), generator=g)]


def _collate(pairs: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    """(input, target) pairs -> input_ids / attention_mask [B, S] right-padded with `<pad>` 0, labels [B, L] with
    IGNORE past each target (transformers shifts them right into decoder inputs)."""
    S, L = max(len(i) for i, _ in pairs), max(len(t) for _, t in pairs)
    input_ids = torch.zeros((len(pairs), S), dtype=torch.long)  # [B, S]
    labels = torch.full((len(pairs), L), IGNORE, dtype=torch.long)  # [B, L]
    for b, (i, t) in enumerate(pairs):
        input_ids[b, : len(i)] = torch.tensor(i)
        labels[b, : len(t)] = torch.tensor(t)
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}


@torch.no_grad()
def _heldout_loss(model: T5ForConditionalGeneration, pairs: list[tuple[list[int], list[int]]]) -> float:
    """Nats per target token over every held-out target, 64 captions at a time."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(pairs), 64):
        batch = _collate(pairs[i : i + 64])
        logits = model(**batch).logits  # [B, L, V]
        total += float(
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum")
        )
        count += int((batch["labels"] != IGNORE).sum())
    model.train()
    return total / count

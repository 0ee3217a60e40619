"""Recipe: train the MoT adapter (frozen Llama 3.2 + frozen MusicGen decoder) from token shards alone.

    python -m adapter_trainer +experiment=demo

Features:
    - Reads ONLY shard sets (docs/shard-format.md). This process never builds an audio codec, never loads codec
      weights and never imports tokenizer_pipeline: batches are plain integer tensors with no autograd history,
      which is what cured the original "Trying to backward through the graph a second time" bug (codes used to
      come out of a live codec graph).
    - Gradient accumulation, global-norm clipping, AdamW on the trainable parameters only, warmup + cosine LR.
    - Autocast per device/precision (bf16/fp16); a GradScaler only for fp16 on CUDA.
    - Metrics through `MetricLogger` (metrics.jsonl + TensorBoard), tqdm with loss and tokens/s.
    - Eval: per-codebook CE/perplexity, END CE, unigram baseline on the same targets, caption-conditioning gain
      with a bootstrap interval; a "learning check" block + final_metrics.json at the end.
    - Checkpoints with exact resume (data position, RNG, optimizer, scheduler); resume refuses a different
      architecture or different data.

Raises:
    ConfigError: a config value cannot work here (missing device, fp16 off CUDA, missing model dir); names the fix.
    ShardFormatError: shards break the contract or do not match the audio LM.
    ResumeError: the checkpoint does not fit this run.
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from tqdm import tqdm

from adapter_trainer.caption_dropout import drop_caption
from adapter_trainer.checkpoint import (
    TrainingProgress,
    check_fingerprint,
    find_checkpoint,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from adapter_trainer.config import ConfigError, TrainConfig, config_to_yaml, mot_fields
from adapter_trainer.evaluation import (
    CEAccumulator,
    average_runs,
    EvalReport,
    derangement,
    learning_check_text,
    make_report,
    unigram_ce,
    unigram_log_probs,
)
from adapter_trainer.metric_logging import FanOutLogger, JsonlLogger, MetricLogger, TensorBoardLogger, read_jsonl
from adapter_trainer.shards import Clip, load_split, open_shard_sets
from adapter_trainer.token_layout import AudioVocab, Batch, collate, encode_example

TARGET_REL_PCT = 10.0  # learning-check target: eval CE at least this % under the unigram baseline
_PRECISION_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(requested: str) -> torch.device:
    """`auto` -> cuda > mps > cpu. An explicitly requested device that is missing is a ConfigError, not a fallback."""
    has_mps = hasattr(torch.backends, "mps") and torch.backends.mps.is_available()
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if has_mps else "cpu")
    try:
        dev = torch.device(requested)
    except RuntimeError as e:
        raise ConfigError(f"trainer.device={requested!r} is not a device ({e}); use auto, cpu, cuda, cuda:N or mps") from e
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": has_mps}
    if dev.type not in available:
        raise ConfigError(f"trainer.device={requested!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    if not available[dev.type]:
        raise ConfigError(
            f"trainer.device={requested} was requested but {dev.type.upper()} is not available on this machine. "
            f"Override it: trainer.device=cpu (or trainer.device=auto to pick the best available device)"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"trainer.device={requested}: only {torch.cuda.device_count()} CUDA device(s); "
                          f"use trainer.device=cuda:0 or trainer.device=auto")
    return dev


def check_precision(precision: str, device: torch.device) -> None:
    """fp16 only on CUDA (needs a GradScaler); bf16 on CUDA only where the GPU supports it."""
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(f"trainer.precision=fp16 needs CUDA (loss scaling with a GradScaler); on {device.type} use "
                          f"trainer.precision=fp32 (or bf16)")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("trainer.precision=bf16 is not supported by this GPU; use trainer.precision=fp16 or fp32")


class WarmupCosine:
    """LR factor: linear warmup to 1 over `warmup` steps, then cosine to `min_ratio` at `max_steps`."""

    def __init__(self, warmup: int, max_steps: int, min_ratio: float) -> None:
        self.warmup, self.max_steps, self.min_ratio = warmup, max_steps, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)
        progress = min(1.0, (step - self.warmup) / max(1, self.max_steps - self.warmup))
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def batch_facts(batch: Batch) -> dict[str, dict[str, Any]]:
    """dtype / requires_grad / grad_fn of each batch tensor (for the isolation test and the invariant check)."""
    return {
        name: {"dtype": str(t.dtype), "requires_grad": bool(t.requires_grad), "has_grad_fn": t.grad_fn is not None,
               "is_floating_point": bool(t.is_floating_point())}
        for name, t in (("tokens", batch.tokens), ("is_audio", batch.is_audio), ("labels", batch.labels),
                        ("attention_mask", batch.attention_mask))
    }


class MoTAdapterRecipe:
    """setup() builds everything, train() is the loop, cleanup() evaluates, plots and reports."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.output_dir = Path(cfg.trainer.output_dir)
        self.grad_accum = cfg.trainer.grad_accum_steps
        self.max_steps = cfg.trainer.max_steps
        self.progress = TrainingProgress()
        self.last_eval: EvalReport | None = None
        self.last_batch_facts: dict[str, dict[str, Any]] = {}
        self._perm_cache: tuple[int, np.ndarray] | None = None
        self._t0 = time.perf_counter()

    # ------------------------------------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.trainer.seed)
        np.random.seed(cfg.trainer.seed % 2**32)
        random.seed(cfg.trainer.seed)
        self.device = resolve_device(cfg.trainer.device)
        check_precision(cfg.trainer.precision, self.device)
        self.output_dir.mkdir(parents=True, exist_ok=True)

        # Imported here, not at module top: model_builders/mot pull in transformers; config/shard errors come first.
        from adapter_trainer.model_builders import (
            load_llm,
            load_musicgen_decoder,
            load_musicgen_decoder_config,
            load_text_tokenizer,
        )
        from adapter_trainer.mot import MoTAdapterModel, MoTConfig

        # Shards first (cheap), checked against the audio LM's config before any weights are loaded.
        try:
            dec_cfg = load_musicgen_decoder_config(cfg.model.audio_lm)
        except OSError as e:
            raise ConfigError(f"model.audio_lm={cfg.model.audio_lm}: {e}") from e
        self.shard_sets = open_shard_sets(cfg.data.shards, model_n_codebooks=dec_cfg.num_codebooks,
                                          model_codebook_size=dec_cfg.vocab_size, audio_lm=cfg.model.audio_lm)
        self.train_clips: list[Clip] = load_split(self.shard_sets, cfg.data.train_split, sha256=cfg.data.verify_sha256)
        self.eval_clips: list[Clip] = load_split(self.shard_sets, cfg.data.eval_split,
                                                 max_clips=cfg.data.eval_max_clips, sha256=cfg.data.verify_sha256)
        if not self.train_clips:
            raise ConfigError(f"split data.train_split={cfg.data.train_split!r} is empty in {cfg.data.shards}")
        if len(self.eval_clips) < 2:
            raise ConfigError(f"split data.eval_split={cfg.data.eval_split!r} has {len(self.eval_clips)} clip(s) in "
                              f"{cfg.data.shards}; the caption-gain check needs >= 2 (set data.eval_max_clips=0)")

        try:
            self.tokenizer = load_text_tokenizer(cfg.model.llm)
            llm = load_llm(cfg.model.llm, cfg.model.dtype)
            audio_lm = load_musicgen_decoder(cfg.model.audio_lm, cfg.model.dtype)
        except OSError as e:
            raise ConfigError(f"model.llm={cfg.model.llm} / model.audio_lm={cfg.model.audio_lm}: {e}") from e
        K, C = audio_lm.config.num_codebooks, audio_lm.config.vocab_size
        self.vocab = AudioVocab(text_vocab_size=llm.config.vocab_size, n_codebooks=K, codebook_size=C)
        self.bos_id = int(self.tokenizer.bos_token_id)
        # Pad positions are masked out and carry no labels; any valid text id works, EOS is the natural one.
        self.pad_id = int(self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else self.bos_id)
        self.model = MoTAdapterModel(llm, audio_lm, self.vocab, cfg.data.pattern, MoTConfig(**mot_fields(cfg)))
        self.model.to(self.device)

        # Captions tokenized once (without BOS; encode_example adds it).
        mct = cfg.data.max_caption_tokens
        self.train_caps = [self._caption_ids(self._text_of(c))[:mct] for c in self.train_clips]
        self.eval_caps = [self._caption_ids(self._text_of(c))[:mct] for c in self.eval_clips]
        # Unigram baseline from the train split; deranged captions for the caption-gain check (fixed per run).
        self.unigram_logp = unigram_log_probs((c.codes for c in self.train_clips), K, C)  # [K, C]
        # Several derangements, averaged: one shuffle alone makes the per-clip gain depend on which caption a clip
        # happened to get (a same-instrument caption gains nothing), which widens the bootstrap interval.
        shuffle_rng = np.random.default_rng([cfg.trainer.seed, 7])
        self.eval_perms = [derangement(len(self.eval_clips), shuffle_rng)
                           for _ in range(cfg.trainer.eval_caption_shuffles)]

        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not self.trainable:
            raise ConfigError("the MoT adapter has no trainable parameters; check model.mot.*")
        decay = [p for p in self.trainable if p.ndim >= 2]
        no_decay = [p for p in self.trainable if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.optimizer.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.optimizer.lr, betas=(cfg.optimizer.betas[0], cfg.optimizer.betas[1]),
        )
        schedule = WarmupCosine(cfg.optimizer.warmup_steps, self.max_steps, cfg.optimizer.min_lr_ratio)
        # Wrapped in a plain lambda so LambdaLR does not store (and on resume restore) the schedule's fields:
        # the config's warmup/max_steps win, e.g. when a run is resumed with a larger trainer.max_steps.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: schedule(step))
        self.amp_dtype = _PRECISION_DTYPE[cfg.trainer.precision]
        self.scaler = torch.amp.GradScaler("cuda") if cfg.trainer.precision == "fp16" else None

        self.fingerprint = self._fingerprint()
        resume_step: int | None = None
        if cfg.trainer.resume:
            ckpt_dir = find_checkpoint(cfg.trainer.resume, self.output_dir)
            ckpt = load_checkpoint(ckpt_dir, device=self.device)
            check_fingerprint(ckpt.fingerprint, self.fingerprint, ckpt_dir)
            self.model.load_trainable_state_dict(ckpt.adapter)
            self.optimizer.load_state_dict(ckpt.optimizer)
            self.scheduler.load_state_dict(ckpt.scheduler)
            if self.scaler is not None and ckpt.scaler is not None:
                self.scaler.load_state_dict(ckpt.scaler)
            restore_rng(ckpt.rng_torch, ckpt.rng)
            self.progress = ckpt.progress
            resume_step = self.progress.step
            print(f"resumed from {ckpt_dir} at step {self.progress.step} (epoch {self.progress.epoch}, "
                  f"index {self.progress.index})")

        loggers: list[MetricLogger] = [JsonlLogger(self.output_dir / "metrics.jsonl", truncate_after_step=resume_step)]
        if cfg.trainer.tensorboard:
            loggers.append(TensorBoardLogger(self.output_dir / "tb", purge_step=(resume_step + 1) if resume_step else None))
        self.logger: MetricLogger = FanOutLogger(loggers)
        (self.output_dir / "config.yaml").write_text(config_to_yaml(cfg))
        n_train = sum(p.numel() for p in self.trainable)
        print(f"device={self.device} precision={cfg.trainer.precision} pattern={cfg.data.pattern} "
              f"train clips={len(self.train_clips)} eval clips={len(self.eval_clips)} trainable params={n_train:,} "
              f"output_dir={self.output_dir}")

    def _text_of(self, clip: Clip) -> str:
        """The conditioning text: the caption, or the aspect list joined with ", " (data.text)."""
        return clip.caption if self.cfg.data.text == "caption" else ", ".join(clip.aspects)

    def _caption_ids(self, caption: str) -> list[int]:
        return list(self.tokenizer(caption, add_special_tokens=False)["input_ids"])

    def _fingerprint(self) -> dict[str, Any]:
        """What a resumed run must share with the checkpoint (architecture + data identity)."""
        c = self.cfg
        return {
            "model.llm": c.model.llm, "model.audio_lm": c.model.audio_lm, "model.dtype": c.model.dtype,
            "model.mot": mot_fields(c), "data.pattern": c.data.pattern,
            "vocab": [self.vocab.text_vocab_size, self.vocab.n_codebooks, self.vocab.codebook_size],
            "trainable_shapes": {k: list(v.shape) for k, v in self.model.trainable_state_dict().items()},
            "data.manifest_sha256": [s.manifest_sha256 for s in self.shard_sets],
            "data.splits": [c.data.train_split, c.data.eval_split],
        }

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.cfg.trainer.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    # ------------------------------------------------------------------------------------------------- data
    def _epoch_perm(self, epoch: int) -> np.ndarray:
        """Seeded permutation of the train clips for `epoch` (a pure function of seed and epoch)."""
        if self._perm_cache is None or self._perm_cache[0] != epoch:
            rng = np.random.default_rng([self.cfg.trainer.seed, epoch])
            self._perm_cache = (epoch, rng.permutation(len(self.train_clips)))
        return self._perm_cache[1]

    def _next_positions(self, n: int) -> Iterator[tuple[int, int, int]]:
        """Advance the data position by n examples; yields (epoch, index, clip id). Crosses epochs seamlessly."""
        for _ in range(n):
            perm = self._epoch_perm(self.progress.epoch)
            yield self.progress.epoch, self.progress.index, int(perm[self.progress.index])
            self.progress.index += 1
            if self.progress.index >= len(perm):
                self.progress.epoch, self.progress.index = self.progress.epoch + 1, 0

    def next_train_batch(self) -> Batch:
        """The next micro-batch: random crops, RNG derived from (seed, epoch, index) so resume is exact."""
        d = self.cfg.data
        examples = []
        for epoch, index, i in self._next_positions(self.cfg.trainer.batch_size):
            rng = np.random.default_rng([self.cfg.trainer.seed, epoch, index])
            # caption dropout draws from its own stream (seed, epoch, index, 1): crops stay as without it, resume exact
            caption = drop_caption(self.train_caps[i], d.caption_dropout,
                                   np.random.default_rng([self.cfg.trainer.seed, epoch, index, 1]))
            examples.append(encode_example(caption, self.train_clips[i].codes, vocab=self.vocab,
                                           pattern=d.pattern, bos_id=self.bos_id, max_seq_len=d.max_seq_len,
                                           max_caption_tokens=d.max_caption_tokens, crop="random", rng=rng,
                                           key=self.train_clips[i].key))
        batch = collate(examples, pad_id=self.pad_id)  # tokens/labels [B, S, J] long, masks [B, S] bool
        self.last_batch_facts = batch_facts(batch)
        if any(f["requires_grad"] or f["has_grad_fn"] or f["is_floating_point"] for f in self.last_batch_facts.values()):
            raise RuntimeError(f"batch tensors must be plain integer tensors without autograd history: {self.last_batch_facts}")
        return batch.to(self.device)

    # ------------------------------------------------------------------------------------------------ train
    def train(self) -> None:
        cfg = self.cfg.trainer
        model, optimizer, scheduler, scaler = self.model, self.optimizer, self.scheduler, self.scaler
        K = self.vocab.n_codebooks
        pbar = tqdm(total=self.max_steps, initial=self.progress.step, disable=not cfg.progress_bar,
                    desc="train", dynamic_ncols=True)
        t_log, tokens_log = time.perf_counter(), 0
        while self.progress.step < self.max_steps:
            model.train()
            optimizer.zero_grad(set_to_none=True)
            loss_acc = 0.0
            ce_k, n_k = torch.zeros(K, dtype=torch.float64), torch.zeros(K, dtype=torch.long)
            for _ in range(self.grad_accum):
                batch = self.next_train_batch()
                with self.autocast():
                    out = model.compute_loss(batch)  # LossOutput; out.loss: [] mean CE over the micro-batch's targets
                loss = out.loss / self.grad_accum  # mean of micro-batch means
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite loss {loss.item()} at step {self.progress.step + 1}; lower "
                                             f"optimizer.lr, raise optimizer.warmup_steps or use trainer.precision=fp32")
                if scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                loss_acc += loss.item()
                ce_k += out.ce_sum_per_codebook.detach().double().cpu()
                n_k += out.count_per_codebook.detach().cpu()
                n_tok = int(batch.attention_mask.sum())
                tokens_log += n_tok
                self.progress.tokens_seen += n_tok
            if scaler is not None:
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            max_norm = self.cfg.optimizer.grad_clip if self.cfg.optimizer.grad_clip > 0 else float("inf")
            grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, max_norm)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            self.progress.step += 1
            step = self.progress.step

            dt = time.perf_counter() - t_log
            pbar.update(1)
            pbar.set_postfix(loss=f"{loss_acc:.3f}", tok_s=f"{tokens_log / max(dt, 1e-9):.0f}")
            if step % cfg.log_every == 0 or step == self.max_steps:
                payload = {"train/loss": loss_acc, "train/lr": scheduler.get_last_lr()[0],
                           "train/grad_norm": float(grad_norm), "train/tokens_per_s": tokens_log / max(dt, 1e-9),
                           "train/tokens_seen": self.progress.tokens_seen, "train/epoch": self.progress.epoch}
                payload.update({f"train/ce_cb{k}": float(ce_k[k] / max(int(n_k[k]), 1)) for k in range(K)})
                self.logger.log_dict(payload, step)
                t_log, tokens_log = time.perf_counter(), 0
            if cfg.eval_every and step % cfg.eval_every == 0:
                self.last_eval = self.evaluate()
                self.logger.log_dict(self.last_eval.scalars(), step)
                tqdm.write(f"step {step}: eval CE {self.last_eval.ce:.4f} (unigram {self.last_eval.unigram_ce:.4f}), "
                           f"caption gain {self.last_eval.caption_gain:+.4f}")
            if cfg.ckpt_every and step % cfg.ckpt_every == 0:
                path = self.save_checkpoint()
                tqdm.write(f"step {step}: checkpoint {path}")
        pbar.close()

    def save_checkpoint(self) -> Path:
        return save_checkpoint(self.output_dir, adapter=self.model.trainable_state_dict(), optimizer=self.optimizer,
                               scheduler=self.scheduler, scaler=self.scaler, progress=self.progress,
                               fingerprint=self.fingerprint, config_yaml=config_to_yaml(self.cfg))

    # ------------------------------------------------------------------------------------------------- eval
    @torch.no_grad()
    def evaluate(self) -> EvalReport:
        """Score the eval clips with true and with deranged captions on exactly the same code targets.

        Deterministic: crop="start", and every clip gets the same audio budget whatever its caption length
        (max_seq_len - max_caption_tokens - 2 positions for BOS + AUDIO_START), so true and shuffled captions
        score identical targets (make_report checks it).
        """
        d = self.cfg.data
        self.model.eval()
        K = self.vocab.n_codebooks
        audio_budget = d.max_seq_len - d.max_caption_tokens - 2
        runs = [("true", None), *((f"shuf{r}", perm) for r, perm in enumerate(self.eval_perms))]
        sums = {name: CEAccumulator(K) for name in [*(n for n, _ in runs), "uni"]}
        end_sum, end_n = 0.0, 0
        bs = self.cfg.trainer.batch_size
        for start in range(0, len(self.eval_clips), bs):
            ids = range(start, min(start + bs, len(self.eval_clips)))
            for name, perm in runs:
                caps = [self.eval_caps[i if perm is None else int(perm[i])] for i in ids]
                examples = [encode_example(cap, self.eval_clips[i].codes, vocab=self.vocab, pattern=d.pattern,
                                           bos_id=self.bos_id, max_seq_len=len(cap) + 2 + audio_budget,
                                           max_caption_tokens=d.max_caption_tokens, crop="start",
                                           rng=np.random.default_rng(0), key=self.eval_clips[i].key)
                            for cap, i in zip(caps, ids)]
                batch = collate(examples, pad_id=self.pad_id).to(self.device)
                with self.autocast():
                    out = self.model.compute_loss(batch)
                sums[name].add(out.ce_sum_per_codebook, out.count_per_codebook, out.ce_sum_per_example,
                               out.count_per_example)
                if name == "true":
                    end_sum += float(out.end_ce_sum)
                    end_n += int(out.end_count)
                    u = unigram_ce(batch.labels, self.vocab, self.unigram_logp)
                    sums["uni"].add(u.sum_per_codebook, u.count_per_codebook, u.sum_per_example, u.count_per_example)
        final = {k: v.result() for k, v in sums.items()}
        self.model.train()
        shuffled = average_runs([final[name] for name, perm in runs if perm is not None])  # mean over derangements
        return make_report(step=self.progress.step, model_true=final["true"], model_shuf=shuffled,
                           unigram=final["uni"], end_ce_sum=end_sum, end_count=end_n,
                           n_bootstrap=self.cfg.trainer.eval_bootstrap, seed=self.cfg.trainer.seed)

    # ---------------------------------------------------------------------------------------------- cleanup
    def cleanup(self) -> dict[str, Any]:
        """Final eval + checkpoint, loss curve, final_metrics.json, the learning-check block. Returns the metrics."""
        step = self.progress.step
        if self.last_eval is None or self.last_eval.step != step:
            self.last_eval = self.evaluate()
            self.logger.log_dict(self.last_eval.scalars(), step)
        ckpt = self.output_dir / "checkpoints" / f"step-{step:06d}"
        if not ckpt.exists():
            ckpt = self.save_checkpoint()
        self.logger.close()
        r = self.last_eval
        wall = time.perf_counter() - self._t0
        final = {
            "step": step,
            "learning_check": {
                "eval_ce": r.ce, "unigram_ce": r.unigram_ce, "rel_to_unigram_pct": r.rel_to_unigram_pct,
                "target_rel_pct": TARGET_REL_PCT, "rel_pass": r.rel_to_unigram_pct >= TARGET_REL_PCT,
                "caption_gain": r.caption_gain, "caption_gain_ci95": [r.caption_gain_lo, r.caption_gain_hi],
                "caption_gain_pass": r.caption_gain_lo > 0.0,
            },
            "eval": r.to_dict(),
            "progress": asdict(self.progress),
            "wall_time_s": wall,
            "checkpoint": str(ckpt),
        }
        (self.output_dir / "final_metrics.json").write_text(json.dumps(_finite_or_none(final), indent=2, allow_nan=False) + "\n")
        plot_path = plot_loss_curve(self.output_dir / "metrics.jsonl", self.output_dir / "loss_curve.png")
        print(learning_check_text(r, target_rel_pct=TARGET_REL_PCT))
        print(f"summary: {step} steps, {self.progress.tokens_seen:,} tokens, {wall:.1f} s wall, epoch "
              f"{self.progress.epoch}; wrote {self.output_dir / 'final_metrics.json'}, {plot_path}, {ckpt}")
        if self.cfg.trainer.debug_dump_modules:
            self.dump_debug(Path(self.cfg.trainer.debug_dump_modules))
        return final

    def dump_debug(self, path: Path) -> None:
        """Test hook: which modules this process imported, EnCodec instances alive, the last batch's tensor facts."""
        gc.collect()
        encodec = sum(1 for o in gc.get_objects() if type(o).__name__ == "EncodecModel")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"modules": sorted(sys.modules), "encodec_instances": encodec,
                                    "batch": self.last_batch_facts}, indent=2))


def _finite_or_none(x: Any) -> Any:
    """NaN/inf -> None recursively, so final_metrics.json is strict JSON (e.g. END CE when no clip ends in the window)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    return x


def plot_loss_curve(metrics_path: Path, out_path: Path) -> Path:
    """Train loss per logged step + eval CE and the unigram baseline, as a PNG (matplotlib Agg, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = read_jsonl(metrics_path)
    train = [(r["step"], r["train/loss"]) for r in recs if "train/loss" in r]
    evals = [(r["step"], r["eval/ce"], r["eval/unigram_ce"]) for r in recs if "eval/ce" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train loss (codes + END)")
    if evals:
        s, ce, uni = zip(*evals)
        ax.plot(s, ce, "o-", label="eval CE (codes)")
        ax.plot(s, uni, "--", label="eval unigram baseline")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("nats / target")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def recipe_main(cfg: TrainConfig) -> dict[str, Any]:
    """setup -> train -> cleanup. Returns final_metrics (also written to <output_dir>/final_metrics.json)."""
    recipe = MoTAdapterRecipe(cfg)
    recipe.setup()
    recipe.train()
    return recipe.cleanup()

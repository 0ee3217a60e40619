"""Recipe: train the MoT adapter (frozen Llama 3.2 + frozen MusicGen decoder) from token shards alone.

    python -m adapter_trainer +experiment=demo

A leaf over the library (torchtune style): nothing imports this module but `__main__` and the tests.
`setup()` delegates to `_setup_*` methods, `train()` is the whole loop top to bottom, `cleanup()` evaluates,
plots and reports. What the recipe uses lives in its rooms:
    model.builders.build_mot_model         frozen towers + adapter (shared with generation)
    data.shards / data.streaming           the shard index and DataLoader workers that read, crop and collate
    training.step.backward_window          forward + backward of one accumulation window
    training.optim                         AdamW groups, warmup + cosine schedule
    training.checkpoint                    save / resume (exact: data position, RNG, optimizer, scheduler)
    training.distributed                   torchrun: gloo on CPU, NCCL on cuda:LOCAL_RANK, rank 0 writes
    evaluation.learning_check              unigram baseline, caption derangements, bootstrap, the report

Features:
    - Reads ONLY shard sets (docs/shard-format.md). This process never builds an audio codec, never loads codec
      weights and never imports tokenizer_pipeline: batches are plain integer tensors with no autograd history,
      which is what cured the original "Trying to backward through the graph a second time" bug (codes used to
      come out of a live codec graph).
    - Gradient accumulation (loss normalised by the targets of the whole window), global-norm clipping, AdamW on
      the trainable parameters only (fp32 master weights whatever model.dtype is), warmup + cosine LR.
    - Autocast per device/precision (bf16/fp16); a GradScaler only for fp16 on CUDA.
    - Metrics through `MetricLogger` (metrics.jsonl + TensorBoard), tqdm with loss and tokens/s.
    - Eval: per-codebook CE/perplexity, END CE, unigram baseline on the same targets, caption-conditioning gain
      with a bootstrap interval; a "learning check" block + final_metrics.json at the end.
    - torchrun DDP: trainer.batch_size per rank, the global example order of one process, only trainable
      gradients all-reduced, eval split across ranks and gathered.

Raises:
    ConfigError: a config value cannot work here (missing device, fp16 off CUDA, missing model dir); names the fix.
    ShardFormatError: shards break the contract or do not match the audio LM.
    ResumeError: the checkpoint does not fit this run.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from tqdm import tqdm

from adapter_trainer.config import ConfigError, TrainConfig, config_to_yaml
from adapter_trainer.data.shards import ClipReader, SplitIndex, build_index, open_shard_sets
from adapter_trainer.data.streaming import ExampleSpec, TrainBatches, caption_ids, default_num_workers, train_loader
from adapter_trainer.data.token_layout import Batch, collate, encode_example
from adapter_trainer.evaluation.learning_check import (
    CEAccumulator,
    EvalReport,
    average_runs,
    check_held_out,
    derangement,
    gather_target_ce,
    learning_check_text,
    make_report,
    unigram_ce,
    unigram_log_probs,
)
from adapter_trainer.training.checkpoint import (
    TrainingProgress,
    check_fingerprint,
    find_checkpoint,
    load_checkpoint,
    load_optimizer_with_config,
    optimizer_changes,
    prepare_output_dir,
    restore_rng,
    run_fingerprint,
    save_checkpoint,
)
from adapter_trainer.training.device import autocast, check_precision, resolve_device
from adapter_trainer.training.distributed import RankInfo, device_for_rank, init_distributed, teardown_distributed
from adapter_trainer.training.metric_logging import (
    FanOutLogger,
    JsonlLogger,
    MetricLogger,
    TensorBoardLogger,
    finite_or_none,
)
from adapter_trainer.training.optim import WarmupCosine, build_optimizer, build_scheduler
from adapter_trainer.training.plots import plot_loss_curve
from adapter_trainer.training.step import backward_window, batch_facts, check_plain_integer_batch, count_targets

TARGET_REL_PCT = 10.0  # learning-check target: eval CE at least this % under the unigram baseline


class MoTAdapterRecipe:
    """setup() builds everything, train() is the loop, cleanup() evaluates, plots and reports."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.output_dir = Path(cfg.trainer.output_dir)
        self.grad_accum = cfg.trainer.grad_accum_steps
        self.max_steps = cfg.trainer.max_steps
        self.progress = TrainingProgress()
        self.last_eval: EvalReport | None = None
        self.last_batch_facts: dict[str, dict[str, Any]] = {}  # dtype/grad facts of the last micro-batch
        self.data_wait_s = 0.0  # time the loop waited for its next batch (since the last log)
        self._t0 = time.perf_counter()

    # ------------------------------------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Everything the loop needs, in an order that matters: config and shard errors before any weight is
        loaded, the model built right after seeding (its new weights draw from torch's RNG), resume last."""
        cfg = self.cfg
        torch.manual_seed(cfg.trainer.seed)
        np.random.seed(cfg.trainer.seed % 2**32)
        random.seed(cfg.trainer.seed)
        self._setup_device()
        self._setup_output_dir()
        self._setup_data()
        self._setup_model()
        self._setup_eval()
        self._setup_optimizer()
        resume_step = self._resume() if cfg.trainer.resume else None
        self._setup_logging(resume_step)
        self.num_workers = cfg.trainer.num_workers if cfg.trainer.num_workers >= 0 else default_num_workers(
            self.dist.local_world_size)
        if self.dist.is_main:
            n_train = sum(p.numel() for p in self.trainable)
            print(f"device={self.device} precision={cfg.trainer.precision} pattern={cfg.data.pattern} "
                  f"train clips={len(self.train_index)} eval clips={len(self.eval_index)} trainable params={n_train:,} "
                  f"ranks={self.dist.world_size} batch/rank={cfg.trainer.batch_size} workers/rank={self.num_workers} "
                  f"output_dir={self.output_dir}")

    def _setup_device(self) -> None:
        """The device, the precision check, and this process's place in a torchrun job."""
        self.device = resolve_device(self.cfg.trainer.device)
        check_precision(self.cfg.trainer.precision, self.device)
        # DataLoader workers tokenize captions in forked processes: the Rust tokenizer's thread pool must not be
        # started in the parent first (HF tokenizers then warns and disables it in every worker anyway).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # torchrun: join the job (gloo on CPU, NCCL on cuda:LOCAL_RANK); one process: a no-op RankInfo.
        self.dist: RankInfo = init_distributed(self.device)
        self.device = device_for_rank(self.device, self.dist)

    def _setup_output_dir(self) -> None:
        """Rank 0 checks (and with trainer.overwrite cleans) the run directory; its error is raised on every rank."""
        # Hydra's ${now:...} output_dir may resolve differently per rank: rank 0's wins.
        self.output_dir = Path(self.dist.broadcast_object(str(self.output_dir)))
        # A ResumeError refusal or an OSError from the file system goes to every rank, so no rank waits in a
        # collective for rank 0.
        refusal: Exception | None = None
        if self.dist.is_main:
            try:
                prepare_output_dir(self.output_dir, resume=self.cfg.trainer.resume, overwrite=self.cfg.trainer.overwrite)
                self.output_dir.mkdir(parents=True, exist_ok=True)
            except Exception as e:  # re-raised just below, on every rank
                refusal = e
        refusal = self.dist.broadcast_object(refusal)
        if refusal is not None:
            raise refusal

    def _setup_data(self) -> None:
        """Shard sets (checked against the audio LM's config before any weight is loaded), split indexes, held-out check."""
        # Imported here, not at module top: builders/mot pull in transformers; config/shard errors come first.
        from adapter_trainer.model.builders import load_audio_lm_config

        d = self.cfg.data
        dec_cfg = load_audio_lm_config(self.cfg)
        self.shard_sets = open_shard_sets(d.shards, model_n_codebooks=dec_cfg.num_codebooks,
                                          model_codebook_size=dec_cfg.vocab_size, audio_lm=self.cfg.model.audio_lm)
        # Header-only index (~40 bytes per clip); codes are read per batch by DataLoader workers / per eval batch.
        self.train_index: SplitIndex = build_index(self.shard_sets, d.train_split, sha256=d.verify_sha256)
        self.eval_index: SplitIndex = build_index(self.shard_sets, d.eval_split, max_clips=d.eval_max_clips,
                                                  sha256=d.verify_sha256)
        if not len(self.train_index):
            raise ConfigError(f"split data.train_split={d.train_split!r} is empty in {d.shards}")
        self.n_overlap_clips = check_held_out(
            (self.train_index.key(i) for i in range(len(self.train_index))),
            (self.eval_index.key(i) for i in range(len(self.eval_index))),
            allow_overlap=d.allow_eval_overlap,
            where=f"data.train_split={d.train_split!r} / data.eval_split={d.eval_split!r} in {d.shards}")
        if len(self.eval_index) < 2:
            raise ConfigError(f"split data.eval_split={d.eval_split!r} has {len(self.eval_index)} clip(s) in "
                              f"{d.shards}; the caption-gain check needs >= 2 (set data.eval_max_clips=0)")

    def _setup_model(self) -> None:
        """Frozen towers + adapter (fp32 trainable weights) on the device; the example spec that goes with them."""
        from adapter_trainer.model.builders import build_mot_model

        built = build_mot_model(self.cfg, self.device)
        self.model, self.tokenizer, self.vocab = built.model, built.tokenizer, built.vocab
        self.bos_id, self.pad_id = built.bos_id, built.pad_id
        d = self.cfg.data
        self.spec = ExampleSpec(vocab=self.vocab, pattern=d.pattern, text=d.text, bos_id=self.bos_id, pad_id=self.pad_id,
                                max_seq_len=d.max_seq_len, max_caption_tokens=d.max_caption_tokens,
                                caption_dropout=d.caption_dropout)

    def _setup_eval(self) -> None:
        """Eval captions, the unigram baseline, the train batches and the caption derangements of the gain check."""
        cfg = self.cfg
        # Train captions are tokenized in the DataLoader workers; eval captions once here (every derangement needs
        # all of them), as small int arrays. Eval codes are read per eval batch.
        self.eval_reader = ClipReader(self.eval_index)
        self.eval_caps = [np.asarray(caption_ids(self.tokenizer, self.eval_reader.read(i), self.spec), dtype=np.int64)
                          for i in range(len(self.eval_index))]
        # Unigram baseline from the train split (rank 0 reads, all ranks get it).
        self.unigram_logp = self.dist.broadcast_object(self._unigram_baseline() if self.dist.is_main else None)  # [K, C]
        self.train_data = TrainBatches(self.train_index, self.tokenizer, self.spec, seed=cfg.trainer.seed,
                                       batch_size=cfg.trainer.batch_size, rank=self.dist.rank,
                                       world_size=self.dist.world_size)
        # Several derangements, averaged: one shuffle alone makes the per-clip gain depend on which caption a clip
        # happened to get (a same-instrument caption gains nothing), which widens the bootstrap interval.
        shuffle_rng = np.random.default_rng([cfg.trainer.seed, 7])
        self.eval_perms = [derangement(len(self.eval_index), shuffle_rng)
                           for _ in range(cfg.trainer.eval_caption_shuffles)]

    def _setup_optimizer(self) -> None:
        """AdamW on the trainable parameters (rank 0's initial values on every rank), the LR schedule, GradScaler."""
        cfg = self.cfg
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not self.trainable:
            raise ConfigError("the MoT adapter has no trainable parameters; check model.mot.*")
        self.dist.broadcast_params(self.trainable)  # every rank starts from rank 0's trainable weights (frozen: untouched)
        self.optimizer = build_optimizer(self.trainable, self.model.pretrained_copy_parameters(), cfg.optimizer)
        self.schedule = WarmupCosine(cfg.optimizer.warmup_steps, self.max_steps, cfg.optimizer.min_lr_ratio)
        self.scheduler = build_scheduler(self.optimizer, self.schedule)
        self.scaler = torch.amp.GradScaler("cuda") if cfg.trainer.precision == "fp16" else None
        self.fingerprint = run_fingerprint(cfg, self.vocab, self.model, self.shard_sets)
        self.optimizer_changes: list[str] = []

    def _resume(self) -> int:
        """Continue from trainer.resume: adapter weights, optimizer moments, RNG and data position. Returns the step."""
        ckpt_dir = find_checkpoint(self.cfg.trainer.resume, self.output_dir)
        ckpt = load_checkpoint(ckpt_dir, device=self.device)
        check_fingerprint(ckpt.fingerprint, self.fingerprint, ckpt_dir)
        self.model.load_trainable_state_dict(ckpt.adapter)
        # Config wins for optimizer.* (documented in checkpoint.py); the checkpoint gives the moments and step.
        load_optimizer_with_config(self.optimizer, self.scheduler, ckpt.optimizer, ckpt.scheduler, self.schedule)
        self.optimizer_changes = optimizer_changes(ckpt_dir, asdict(self.cfg.optimizer))
        for line in self.optimizer_changes:
            print(f"resume: {line} (applied: the config wins for optimizer settings)")
        if self.scaler is not None and ckpt.scaler is not None:
            self.scaler.load_state_dict(ckpt.scaler)
        restore_rng(ckpt.rng_torch, ckpt.rng)
        self.progress = ckpt.progress
        print(f"resumed from {ckpt_dir} at step {self.progress.step} (epoch {self.progress.epoch}, "
              f"index {self.progress.index})")
        return self.progress.step

    def _setup_logging(self, resume_step: int | None) -> None:
        """Rank 0 alone writes metrics (and checkpoints, plots, reports); a resumed run truncates later records."""
        loggers: list[MetricLogger] = []
        if self.dist.is_main:
            loggers.append(JsonlLogger(self.output_dir / "metrics.jsonl", truncate_after_step=resume_step))
            if self.cfg.trainer.tensorboard:
                loggers.append(TensorBoardLogger(self.output_dir / "tb",
                                                 purge_step=(resume_step + 1) if resume_step else None))
            (self.output_dir / "config.yaml").write_text(config_to_yaml(self.cfg))
        self.logger: MetricLogger = FanOutLogger(loggers)

    def _unigram_baseline(self) -> np.ndarray:
        """[K, C] unigram log-probs from up to data.unigram_max_clips train clips, evenly spaced (0 = all)."""
        n, m = len(self.train_index), self.cfg.data.unigram_max_clips
        ids = range(n) if m == 0 or m >= n else np.unique(np.linspace(0, n - 1, m).round().astype(np.int64))
        reader = ClipReader(self.train_index)
        try:
            return unigram_log_probs((reader.read(int(i)).codes for i in ids), self.vocab.n_codebooks,
                                     self.vocab.codebook_size)
        finally:
            reader.close()

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.cfg.trainer.precision, self.device)

    # ------------------------------------------------------------------------------------------------- data
    def train_batches(self) -> Iterator[Batch]:
        """This rank's micro-batches from the saved data position to max_steps, built ahead by DataLoader workers.

        The position is the global example number n = epoch * N + index (adapter_trainer/data/streaming.py): the same on
        every rank, advanced by the GLOBAL micro-batch, so resuming works with another world size too.
        """
        start = self.progress.epoch * len(self.train_index) + self.progress.index
        n_micro = (self.max_steps - self.progress.step) * self.grad_accum
        return iter(train_loader(self.train_data, start=start, n_micro_batches=n_micro, num_workers=self.num_workers,
                                 prefetch_factor=self.cfg.trainer.prefetch_factor))

    def next_train_batch(self, batches: Iterator[Batch]) -> Batch:
        """The next micro-batch (random crops, RNG derived from (seed, epoch, index) so resume is exact)."""
        t0 = time.perf_counter()
        batch = next(batches)  # tokens/labels [B, S, J] long, masks [B, S] bool
        self.data_wait_s += time.perf_counter() - t0
        n = self.progress.epoch * len(self.train_index) + self.progress.index + self.train_data.global_batch
        self.progress.epoch, self.progress.index = divmod(n, len(self.train_index))
        self.last_batch_facts = batch_facts(batch)
        check_plain_integer_batch(self.last_batch_facts)
        return batch.to(self.device)

    # ------------------------------------------------------------------------------------------------ train
    def train(self) -> None:
        cfg = self.cfg.trainer
        model, optimizer, scheduler, scaler = self.model, self.optimizer, self.scheduler, self.scaler
        K = self.vocab.n_codebooks
        pbar = tqdm(total=self.max_steps, initial=self.progress.step, disable=not (cfg.progress_bar and self.dist.is_main),
                    desc="train", dynamic_ncols=True)
        batches = self.train_batches()  # this rank's share of each global micro-batch, prefetched by workers
        t_log, tokens_log, step_s = time.perf_counter(), 0, 0.0
        while self.progress.step < self.max_steps:
            t_step = time.perf_counter()
            model.train()  # trainable modules only: the frozen towers stay in eval() (MoTAdapterModel.train)
            optimizer.zero_grad(set_to_none=True)
            # The whole accumulation window is fetched first: the loss is normalised by the number of targets in
            # the window on ALL ranks, and the gradients are summed over ranks: exactly one process's big batch.
            window_batches = [self.next_train_batch(batches) for _ in range(self.grad_accum)]
            n_local = torch.tensor(float(sum(count_targets(b) for b in window_batches)), dtype=torch.float64,
                                   device=self.device)  # [] this rank's targets in the window
            n_window = int(self.dist.all_reduce_sum(n_local).item())  # [] all ranks' targets in the window
            window = backward_window(model, window_batches, autocast=self.autocast, scaler=scaler, n_window=n_window,
                                     step=self.progress.step + 1)
            loss_acc, ce_k, n_k, n_tok_step = (window.loss, window.ce_sum_per_codebook, window.count_per_codebook,
                                               window.n_tokens)
            self.dist.all_reduce_grads(self.trainable)  # SUM over ranks, trainable parameters only (no-op alone)
            if self.dist.is_distributed:  # logged figures over all ranks (one small all-reduce per step)
                stats = torch.cat([torch.tensor([loss_acc, n_tok_step], dtype=torch.float64), ce_k, n_k.double()])
                stats = self.dist.all_reduce_sum(stats.to(self.device)).cpu()  # [2 + 2K]
                loss_acc, n_tok_step = float(stats[0]), int(stats[1])
                ce_k, n_k = stats[2:2 + K], stats[2 + K:].long()
            tokens_log += n_tok_step
            self.progress.tokens_seen += n_tok_step
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
            step_s += time.perf_counter() - t_step  # training time only (no eval / checkpoint)
            pbar.update(1)
            pbar.set_postfix(loss=f"{loss_acc:.3f}", tok_s=f"{tokens_log / max(dt, 1e-9):.0f}")
            if step % cfg.log_every == 0 or step == self.max_steps:
                payload = {"train/loss": loss_acc, "train/lr": scheduler.get_last_lr()[0],
                           "train/grad_norm": float(grad_norm), "train/tokens_per_s": tokens_log / max(dt, 1e-9),
                           "train/tokens_seen": self.progress.tokens_seen, "train/epoch": self.progress.epoch}
                payload.update({f"train/ce_cb{k}": float(ce_k[k] / max(int(n_k[k]), 1)) for k in range(K)})
                # rank 0's wait for its next batch / its step time, over the steps since the last log
                payload.update({"train/data_wait_s": self.data_wait_s, "train/step_s": step_s,
                                "train/data_wait_frac": self.data_wait_s / max(step_s, 1e-9)})
                self.logger.log_dict(payload, step)
                t_log, tokens_log, step_s, self.data_wait_s = time.perf_counter(), 0, 0.0, 0.0
            if cfg.eval_every and step % cfg.eval_every == 0:
                self.last_eval = self.evaluate()  # every rank scores its share; all get the gathered report
                self.logger.log_dict(self.last_eval.scalars(), step)
                if self.dist.is_main:
                    tqdm.write(f"step {step}: eval CE {self.last_eval.ce:.4f} (unigram {self.last_eval.unigram_ce:.4f}), "
                               f"caption gain {self.last_eval.caption_gain:+.4f}")
            if cfg.ckpt_every and step % cfg.ckpt_every == 0:
                if self.dist.is_main:
                    path = self.save_checkpoint()
                    tqdm.write(f"step {step}: checkpoint {path}")
                self.dist.barrier()  # no rank runs ahead of a checkpoint being written
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
        n_eval = len(self.eval_index)
        mine = np.array_split(np.arange(n_eval), self.dist.world_size)[self.dist.rank]  # this rank's clips, each once
        for start in range(0, len(mine), bs):
            ids = [int(i) for i in mine[start:start + bs]]
            clips = {i: self.eval_reader.read(i) for i in ids}
            for name, perm in runs:
                caps = [self.eval_caps[i if perm is None else int(perm[i])].tolist() for i in ids]
                examples = [encode_example(cap, clips[i].codes, vocab=self.vocab, pattern=d.pattern,
                                           bos_id=self.bos_id, max_seq_len=len(cap) + 2 + audio_budget,
                                           max_caption_tokens=d.max_caption_tokens, crop="start",
                                           rng=np.random.default_rng(0), key=clips[i].key)
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
        # Per-clip values from every rank, in clip order: the bootstrap sees what one process would compute.
        final = {k: gather_target_ce(v.result(), mine, n_eval, self.dist.all_gather_object) for k, v in sums.items()}
        end_parts = self.dist.all_gather_object((end_sum, end_n))
        end_sum, end_n = sum(p[0] for p in end_parts), sum(p[1] for p in end_parts)
        self.model.train()
        shuffled = average_runs([final[name] for name, perm in runs if perm is not None])  # mean over derangements
        return make_report(step=self.progress.step, model_true=final["true"], model_shuf=shuffled,
                           unigram=final["uni"], end_ce_sum=end_sum, end_count=end_n,
                           n_bootstrap=self.cfg.trainer.eval_bootstrap, seed=self.cfg.trainer.seed,
                           n_overlap_clips=self.n_overlap_clips)

    # ---------------------------------------------------------------------------------------------- cleanup
    def cleanup(self) -> dict[str, Any]:
        """Final eval + checkpoint, loss curve, final_metrics.json, the learning-check block. Returns the metrics."""
        step = self.progress.step
        if self.last_eval is None or self.last_eval.step != step:
            self.last_eval = self.evaluate()
            self.logger.log_dict(self.last_eval.scalars(), step)
        ckpt = self.output_dir / "checkpoints" / f"step-{step:06d}"
        if self.dist.is_main and not ckpt.exists():
            ckpt = self.save_checkpoint()
        self.dist.barrier()
        self.logger.close()
        r = self.last_eval
        wall = time.perf_counter() - self._t0
        final = {
            "step": step,
            "learning_check": {
                "eval_ce": r.ce, "unigram_ce": r.unigram_ce, "rel_to_unigram_pct": r.rel_to_unigram_pct,
                "target_rel_pct": TARGET_REL_PCT, "rel_pass": r.rel_to_unigram_pct >= TARGET_REL_PCT,
                "caption_gain": r.caption_gain, "caption_gain_ci95": [r.caption_gain_lo, r.caption_gain_hi],
                "caption_gain_pass": r.caption_gain_verdict == "PASS",
                "caption_gain_verdict": r.caption_gain_verdict, "held_out": r.held_out,
                "eval_overlap_clips": r.n_overlap_clips,
            },
            "eval": r.to_dict(),
            "progress": asdict(self.progress),
            "wall_time_s": wall,
            "checkpoint": str(ckpt),
        }
        if not self.dist.is_main:
            return final
        (self.output_dir / "final_metrics.json").write_text(json.dumps(finite_or_none(final), indent=2, allow_nan=False) + "\n")
        plot_path = plot_loss_curve(self.output_dir / "metrics.jsonl", self.output_dir / "loss_curve.png")
        print(learning_check_text(r, target_rel_pct=TARGET_REL_PCT))
        print(f"summary: {step} steps, {self.progress.tokens_seen:,} tokens, {wall:.1f} s wall, epoch "
              f"{self.progress.epoch}; wrote {self.output_dir / 'final_metrics.json'}, {plot_path}, {ckpt}")
        return final


def recipe_main(cfg: TrainConfig) -> dict[str, Any]:
    """setup -> train -> cleanup. Returns final_metrics (also written to <output_dir>/final_metrics.json)."""
    recipe = MoTAdapterRecipe(cfg)
    try:
        recipe.setup()
        recipe.train()
        return recipe.cleanup()
    finally:
        teardown_distributed()

"""Recipe: train the MoT adapter (frozen Llama 3.2 + frozen MusicGen decoder) from token shards alone.

    python -m adapter_trainer +experiment=demo

A leaf over the library (torchtune style): nothing imports it but `__main__` and the tests. `setup()` delegates to
`_setup_*` methods, `train()` is the whole loop top to bottom, `cleanup()` evaluates, plots and reports.
It reads ONLY shard sets (docs/shard-format.md): batches are plain integer tensors, and this process never builds a
codec nor imports tokenizer_pipeline. Each component takes its own config section or the values it needs.

Raises:
    ConfigError: a config value cannot work here (missing device, fp16 off CUDA, missing model dir); names the fix.
    ShardFormatError: shards break the contract or do not match the audio LM.
    ResumeError: the checkpoint does not fit this run.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from adapter_trainer.config import ConfigError, TrainConfig, config_to_yaml
from adapter_trainer.data.streaming import TrainBatches
from adapter_trainer.data.token_layout import Batch
from adapter_trainer.data.worker_lifetime import closing_workers
from adapter_trainer.evaluation.report import EvalReport
from adapter_trainer.training import checkpoint, interrupt
from adapter_trainer.training.data_setup import (
    ask_about_model_sources,
    check_local_sets,
    data_lines,
    example_spec,
    loader_workers,
    open_sets,
    plan_remote_reads,
    resumed_batches,
    split_indexes,
    train_order,
    write_data_sources,
)
from adapter_trainer.training.device import autocast, check_precision, device_memory_gb, resolve_device
from adapter_trainer.training.distributed import RankInfo, device_for_rank, init_distributed, teardown_distributed
from adapter_trainer.training.eval_setup import build_held_out, check_splits, held_out_report
from adapter_trainer.training.final_report import final_metrics, write_final_report
from adapter_trainer.training.metric_logging import FanOutLogger, open_run_loggers
from adapter_trainer.training.model_figures import model_figures
from adapter_trainer.training.optim import WarmupCosine, build_optimizer, build_scheduler
from adapter_trainer.training.resume import resume_run
from adapter_trainer.training.step import (
    accum_group_targets,
    backward_accum_group,
    batch_facts,
    check_plain_integer_batch,
    count_targets,
    sequences_with_end,
    sum_step_figures,
)


class MoTAdapterRecipe:
    """setup() builds everything, train() is the loop, cleanup() evaluates, plots and reports."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.output_dir = Path(cfg.trainer.output_dir)
        self.grad_accum = cfg.trainer.grad_accum_steps
        self.max_steps = cfg.trainer.max_steps
        self.progress = checkpoint.TrainingProgress()
        self.last_eval: EvalReport | None = None
        self.last_batch_facts: dict[str, dict[str, Any]] = {}  # dtype/grad facts of the last micro-batch
        self.data_wait_s = 0.0  # time the loop waited for its next batch (since the last log)
        # this rank's sequences, those with an AUDIO_END target, and loss targets, fetched since the last optimizer step
        self.step_sequences, self.step_end_sequences, self.step_targets = 0, 0, 0
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
        self._setup_train_data()
        self._setup_eval()
        self._setup_optimizer()
        resume_step = self._resume() if cfg.trainer.resume else None
        self._setup_logging(resume_step)
        if self.dist.is_main:
            n_train = sum(p.numel() for p in self.trainable)
            print(
                f"device={self.device} precision={cfg.trainer.precision} pattern={cfg.data.pattern} "
                f"train clips={len(self.train_index)} eval clips={len(self.eval_index)} trainable params={n_train:,} "
                f"ranks={self.dist.world_size} batch/rank={cfg.trainer.batch_size} workers/rank={self.num_workers} "
                f"output_dir={self.output_dir}"
            )
            for line in data_lines(cfg.data, self.train_data, self.shard_sets, self.train_index):
                print(line)

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
        """Rank 0 checks (and with trainer.overwrite cleans) the run directory; its refusal is raised on every rank."""
        # Hydra's ${now:...} output_dir may resolve differently per rank: rank 0's wins.
        self.output_dir = Path(self.dist.broadcast_object(str(self.output_dir)))
        t = self.cfg.trainer

        def prepare() -> None:
            checkpoint.prepare_output_dir(self.output_dir, resume=t.resume, overwrite=t.overwrite)
            self.output_dir.mkdir(parents=True, exist_ok=True)

        self.dist.run_on_main(prepare)

    def _setup_data(self) -> None:
        """Shard sets (checked against the audio LM's config before any weight is loaded), split indexes, held-out check."""
        # Imported here, not at module top: builders/mot pull in transformers; config/shard errors come first.
        from adapter_trainer.model.builders import load_audio_lm_config

        cfg = self.cfg
        check_local_sets(cfg.data)  # the cheapest check and the likeliest mistake: a set that is not there
        ask_about_model_sources(cfg.model, self.dist)  # towers named by Hub ids: rank 0 asks once, for every rank
        dec_cfg = load_audio_lm_config(cfg.model.audio_lm)
        self.num_workers = loader_workers(cfg.trainer.num_workers, self.dist)
        K, C, workers = dec_cfg.num_codebooks, dec_cfg.vocab_size, self.num_workers
        self.shard_sets = open_sets(cfg.data, self.dist, cfg.model.audio_lm, K, C, workers=workers)
        self.train_index, self.eval_index = split_indexes(cfg.data, self.shard_sets)  # header-only
        # the train/eval overlap refusal, the eval split's size; distinct train captions for the learning check
        self.n_overlap_clips, self.n_train_captions = check_splits(cfg.data, self.train_index, self.eval_index)

    def _setup_model(self) -> None:
        """Frozen towers + adapter (fp32 trainable weights) on the device; the example spec that goes with them."""
        from adapter_trainer.model.builders import build_mot_model

        built = build_mot_model(self.cfg.model, self.cfg.data.pattern, self.device)
        self.model, self.tokenizer, self.vocab = built.model, built.tokenizer, built.vocab
        self.model.activation_checkpointing = self.cfg.trainer.activation_checkpointing  # training forward only
        self.bos_id, self.pad_id = built.bos_id, built.pad_id
        self.spec = example_spec(self.cfg.data, self.vocab, bos_id=self.bos_id, pad_id=self.pad_id)

    def _setup_train_data(self) -> None:
        """This rank's share of the global example order; DataLoader workers read, crop, tokenize and collate."""
        t = self.cfg.trainer
        self.train_data = TrainBatches(
            self.train_index,
            self.tokenizer,
            self.spec,
            seed=t.seed,
            batch_size=t.batch_size,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            order=train_order(self.cfg.data, t.seed, self.shard_sets, self.train_index),
        )
        # remote sets: eviction by next use in this order, and this rank's background prefetch
        in_flight = self.num_workers * t.prefetch_factor if self.num_workers > 0 else 1
        self.prefetcher = plan_remote_reads(
            self.train_data, self.train_index, self.dist, self.cfg.data.cache.prefetch, in_flight
        )

    def _setup_eval(self) -> None:
        """The held-out scoring: unigram baseline and caption derangements; the eval captions (tokenized once) and the
        frozen music LM alone on the same targets (scored once) at the first report."""
        self.held_out = build_held_out(
            self.cfg.data,
            self.cfg.trainer,
            self.cfg.model,
            self.train_index,
            self.eval_index,
            self.shard_sets,
            self.tokenizer,
            self.spec,
            self.dist,
            self.device,
            self.autocast,
        )

    def _setup_optimizer(self) -> None:
        """AdamW on the trainable parameters (rank 0's initial values on every rank), the LR schedule, GradScaler."""
        cfg = self.cfg
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not self.trainable:
            raise ConfigError("the MoT adapter has no trainable parameters; check model.mot.*")
        # every rank starts from rank 0's trainable weights (frozen ones are untouched)
        self.dist.broadcast_params(self.trainable)
        self.optimizer = build_optimizer(self.trainable, self.model.pretrained_copy_parameters(), cfg.optimizer)
        self.schedule = WarmupCosine(cfg.optimizer.warmup_steps, self.max_steps, cfg.optimizer.min_lr_ratio)
        self.scheduler = build_scheduler(self.optimizer, self.schedule)
        self.scaler = torch.amp.GradScaler("cuda") if cfg.trainer.precision == "fp16" else None
        self.fingerprint = checkpoint.run_fingerprint(cfg, self.vocab, self.model, self.shard_sets)
        self.optimizer_changes: list[str] = []

    def _resume(self) -> int:
        """Continue from trainer.resume: adapter weights, optimizer moments, RNG and data position. Returns the step."""
        self.progress, self.optimizer_changes = resume_run(
            self.cfg,
            self.output_dir,
            dist=self.dist,
            fingerprint=self.fingerprint,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            schedule=self.schedule,
            scaler=self.scaler,
        )
        return self.progress.step

    def _setup_logging(self, resume_step: int | None) -> None:
        """Rank 0 alone writes metrics (and checkpoints, plots, reports); a resumed run truncates later records."""
        self.logger = FanOutLogger([])
        self.logged_eval_steps: set[int] = set()  # eval records a resumed run finds in metrics.jsonl
        if self.dist.is_main:
            self.logger, self.logged_eval_steps = open_run_loggers(
                self.output_dir, tensorboard=self.cfg.trainer.tensorboard, resume_step=resume_step
            )
            (self.output_dir / "config.yaml").write_text(config_to_yaml(self.cfg))
            write_data_sources(self.output_dir / "data_sources.json", self.cfg.data.shards, self.shard_sets)

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.cfg.trainer.precision, self.device)

    # ------------------------------------------------------------------------------------------------- data
    def train_batches(self) -> Iterator[Batch]:
        """This rank's micro-batches from the saved data position to max_steps, built ahead by DataLoader workers."""
        return resumed_batches(
            self.train_data,
            self.progress,
            n_micro_batches=(self.max_steps - self.progress.step) * self.grad_accum,
            num_workers=self.num_workers,
            prefetch_factor=self.cfg.trainer.prefetch_factor,
            pin_memory=self.device.type == "cuda",
            on_position=self.prefetcher.advance if self.prefetcher is not None else None,
        )

    def next_train_batch(self, batches: Iterator[Batch]) -> Batch:
        """The next micro-batch (random crops, RNG derived from (seed, epoch, index) so resume is exact)."""
        t0 = time.perf_counter()
        batch = next(batches)  # tokens/labels [B, S, J] long, masks [B, S] bool
        self.data_wait_s += time.perf_counter() - t0
        self.step_sequences += len(batch.keys)  # counted on the loader's CPU tensors: no device sync
        self.step_end_sequences += sequences_with_end(batch, self.vocab.audio_end)
        self.step_targets += count_targets(batch)
        n = self.progress.epoch * self.train_data.epoch_size + self.progress.index + self.train_data.global_batch
        self.progress.epoch, self.progress.index = divmod(n, self.train_data.epoch_size)
        self.last_batch_facts = batch_facts(batch)
        check_plain_integer_batch(self.last_batch_facts)
        return batch.to(self.device)

    # ------------------------------------------------------------------------------------------------ train
    def train(self) -> None:
        cfg = self.cfg.trainer
        model, optimizer, scheduler, scaler = self.model, self.optimizer, self.scheduler, self.scaler
        K = self.vocab.n_codebooks
        show = cfg.progress_bar and self.dist.is_main
        pbar = tqdm(
            total=self.max_steps, initial=self.progress.step, disable=not show, desc="train", dynamic_ncols=True
        )
        # this rank's share of each global micro-batch, built ahead by workers that end however the loop is left
        with closing_workers(self.train_batches()) as batches:
            t_log, tokens_log, step_s = time.perf_counter(), 0, 0.0
            stop = interrupt.StopOnInterrupt(self.dist).install()  # Ctrl-C: finish the step, checkpoint it, exit 130
            while self.progress.step < self.max_steps:
                t_step = time.perf_counter()
                model.train()  # trainable modules only: the frozen towers stay in eval() (MoTAdapterModel.train)
                optimizer.zero_grad(set_to_none=True)
                # The whole accumulation group is fetched first: the loss is normalised by the number of targets in
                # the group on ALL ranks, and the gradients are summed over ranks: exactly one process's big batch.
                micro_batches = [self.next_train_batch(batches) for _ in range(self.grad_accum)]
                n_targets = accum_group_targets(self.step_targets, self.dist)  # all ranks' targets in the group
                self.step_targets = 0
                group = backward_accum_group(
                    model,
                    micro_batches,
                    autocast=self.autocast,
                    scaler=scaler,
                    n_targets=n_targets,
                    step=self.progress.step + 1,
                )
                self.dist.all_reduce_grads(self.trainable)  # SUM over ranks, trainable parameters only (no-op alone)
                # logged figures over all ranks (one small all-reduce per step): loss, tokens, sequences, [K] CE sums
                figures = sum_step_figures(group, self.step_sequences, self.step_end_sequences, self.dist)
                self.step_sequences, self.step_end_sequences = 0, 0
                loss_acc, ce_k, n_k = figures.loss, figures.ce_sum_per_codebook, figures.count_per_codebook
                tokens_log += figures.n_tokens
                self.progress.tokens_seen += figures.n_tokens
                self.progress.train_sequences += figures.sequences
                self.progress.train_end_targets += figures.end_sequences
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
                    payload = {
                        "train/loss": loss_acc,
                        "train/lr": scheduler.get_last_lr()[0],
                        "train/grad_norm": float(grad_norm),
                        "train/tokens_per_s": tokens_log / max(dt, 1e-9),
                        "train/tokens_seen": self.progress.tokens_seen,
                        "train/epoch": self.progress.epoch,
                        # rank 0's wait for its next batch / its step time, over the steps since the last log
                        "train/data_wait_s": self.data_wait_s,
                        "train/step_s": step_s,
                        "train/data_wait_frac": self.data_wait_s / max(step_s, 1e-9),
                        **{f"train/ce_cb{k}": float(ce_k[k] / max(int(n_k[k]), 1)) for k in range(K)},
                        **{f"train/{k}": v for k, v in device_memory_gb(self.device).items()},  # cuda / mps only
                        **{f"train/{k}": v for k, v in model_figures(model).items()},  # e.g. caption_scale (musicgen)
                    }
                    self.logger.log_dict(payload, step)
                    t_log, tokens_log, step_s, self.data_wait_s = time.perf_counter(), 0, 0.0, 0.0
                if cfg.eval_every and step % cfg.eval_every == 0:
                    self.last_eval = self.evaluate()  # every rank scores its share; all get the gathered report
                    self.log_eval(self.last_eval, step, announce=True)
                if cfg.ckpt_every and step % cfg.ckpt_every == 0:
                    # no rank runs ahead of a checkpoint being written; a failed write stops every rank
                    self.dist.run_on_main(self._save_and_announce)
                if stop.requested():  # a Ctrl-C on any rank: every rank stops after this same step
                    pbar.close()
                    stop.checkpoint_and_stop(self)  # raises interrupt.TrainingInterrupted
        interrupt.uninstall()
        pbar.close()
        if self.train_data.planner is not None:  # a remote set: no train shard is needed any more
            self.train_data.planner.finish()

    def _save_and_announce(self) -> None:
        tqdm.write(f"step {self.progress.step}: checkpoint {self.save_checkpoint()}")

    def save_checkpoint(self) -> Path:
        return checkpoint.save_checkpoint(
            self.output_dir,
            adapter=self.model.trainable_state_dict(),
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            scaler=self.scaler,
            progress=self.progress,
            fingerprint=self.fingerprint,
            config_yaml=config_to_yaml(self.cfg),
        )

    # ------------------------------------------------------------------------------------------------- eval
    def evaluate(self) -> EvalReport:
        """The held-out report: every rank scores its share of the eval clips, all ranks get the gathered report.
        It also carries what training saw so far (train clips, distinct captions, sequences with an AUDIO_END target)."""
        return held_out_report(
            self.held_out,
            self.model,
            self.cfg.trainer,
            self.dist,
            self.device,
            self.autocast,
            self.progress,
            n_overlap_clips=self.n_overlap_clips,
            n_train_clips=len(self.train_index),
            n_train_captions=self.n_train_captions,
        )

    def log_eval(self, r: EvalReport, step: int, *, announce: bool = False) -> None:
        """The report's scalars (metrics.jsonl, TensorBoard), its caption-gain-by-frame curve (TensorBoard) and, with
        announce, one line on rank 0's console (an eval during training; the final one is the learning check)."""
        self.logger.log_dict(r.scalars(), step)
        self.logger.log_curve("eval/caption_gain_by_frame", r.caption_gain_by_frame, step)
        if announce and self.dist.is_main:
            tqdm.write(
                f"step {step}: eval CE {r.ce:.4f} (unigram {r.unigram_ce:.4f}), caption gain {r.caption_gain:+.4f}"
            )

    # ---------------------------------------------------------------------------------------------- cleanup
    def cleanup(self) -> dict[str, Any]:
        """Final checkpoint (first: a stop in the final eval keeps it), eval, loss curve, final_metrics.json, report."""
        step = self.progress.step
        ckpt = self.output_dir / "checkpoints" / f"step-{step:06d}"
        # rank 0 decides (a node-local disk of another rank never sees its checkpoints); a failed write stops every rank
        self.dist.run_on_main(lambda: None if ckpt.exists() else self.save_checkpoint())
        if self.last_eval is None or self.last_eval.step != step:
            self.last_eval = self.evaluate()
            if step not in self.logged_eval_steps:  # a resumed finished run: its eval at this step is logged already
                self.log_eval(self.last_eval, step)
        self.logger.close()
        if self.prefetcher is not None:
            self.prefetcher.close()
        wall = time.perf_counter() - self._t0
        final = final_metrics(self.last_eval, self.progress, wall_s=wall, ckpt=ckpt, figures=model_figures(self.model))
        if self.dist.is_main:
            write_final_report(self.output_dir, final, self.last_eval, self.progress)
        return final


def recipe_main(cfg: TrainConfig) -> dict[str, Any]:
    """setup -> train -> cleanup. Returns final_metrics (also written to <output_dir>/final_metrics.json)."""
    recipe = MoTAdapterRecipe(cfg)
    try:
        recipe.setup()
        recipe.train()
        return recipe.cleanup()
    finally:
        interrupt.uninstall()  # SIGINT back to its handler whichever way training ended
        if getattr(recipe, "prefetcher", None) is not None:  # a run that stopped early: no thread outlives it
            recipe.prefetcher.close()
        teardown_distributed()

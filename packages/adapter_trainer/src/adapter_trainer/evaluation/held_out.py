"""Held-out clips for the learning check: refuse eval clips that are also train clips (`check_held_out`), and score
them with own captions, deranged captions and the unigram baseline on the same code targets (docs/evaluation.md).
Under torchrun each rank scores its share once; per-clip values are gathered in clip order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from adapter_trainer.data.clip_reader import ClipReader
from adapter_trainer.data.split_index import SplitIndex
from adapter_trainer.data.streaming import ExampleSpec, caption_ids, conditioning_text, eval_example
from adapter_trainer.data.token_layout import Batch, collate, max_frames, target_frames
from adapter_trainer.errors import UserError
from adapter_trainer.evaluation.music_lm_baseline import music_lm_ce_per_target
from adapter_trainer.evaluation.report import EvalReport, make_report, per_set_figures
from adapter_trainer.evaluation.stats import derangement, unigram_log_probs
from adapter_trainer.evaluation.target_ce import (
    CEAccumulator,
    TargetCE,
    average_runs,
    gather_target_ce,
    per_frame_sums,
    unigram_ce,
)


class EvalOverlapError(UserError, ValueError):
    """Eval clips are also train clips, so the eval would not be held-out; the message names the fix."""


def check_held_out(train_keys: Iterable[str], eval_keys: Iterable[str], *, allow_overlap: bool, where: str) -> int:
    """Refuse (EvalOverlapError) eval clips whose keys are also train keys unless `allow_overlap`; returns the overlap
    count. where: the shard sets / splits, for the message."""
    eval_set = set(eval_keys)
    overlap = sorted(set(train_keys) & eval_set)
    eval_n = len(eval_set)
    if overlap and not allow_overlap:
        raise EvalOverlapError(
            f"train/eval overlap: {len(overlap)} of {eval_n} eval clips are also train clips ({where}; first keys: "
            f"{overlap[:5]}), so the eval would not be held-out. Fix: point data.eval_split (or the eval shard set) "
            f"at clips disjoint from training, or pass data.allow_eval_overlap=true to run anyway (the report then "
            f"says the check is NOT held-out)"
        )
    return len(overlap)


def unigram_baseline(index: SplitIndex, n_codebooks: int, codebook_size: int, max_clips: int = 0) -> np.ndarray:
    """[K, C] unigram log-probs of up to `max_clips` evenly spaced clips of `index` (0 = all); from the index's code
    counts, when it holds them, without reading a clip."""
    if index.code_counts is not None:  # the same add-one estimate as unigram_log_probs, from the counts
        counts = index.code_counts.astype(np.float64) + 1.0
        return np.log(counts / counts.sum(axis=1, keepdims=True))
    n = len(index)
    ids = (
        range(n)
        if max_clips == 0 or max_clips >= n
        else np.unique(np.linspace(0, n - 1, max_clips).round().astype(np.int64))
    )
    reader = ClipReader(index)
    try:
        return unigram_log_probs((reader.read(int(i)).codes for i in ids), n_codebooks, codebook_size)
    finally:
        reader.close()


@dataclass(frozen=True)
class EvalRun:
    """Where and how this rank scores its share of the eval clips: `all_gather` collects one value per rank."""

    batch_size: int
    device: torch.device
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    rank: int = 0
    world_size: int = 1
    all_gather: Callable[[Any], list[Any]] = lambda x: [x]

    def share(self, n: int) -> np.ndarray:
        """This rank's clip rows of n, each clip on one rank."""
        return np.array_split(np.arange(n), self.world_size)[self.rank]

    def batches(self, mine: np.ndarray) -> Iterator[list[int]]:
        """`mine` in batches of batch_size clip rows."""
        for start in range(0, len(mine), self.batch_size):
            yield [int(i) for i in mine[start : start + self.batch_size]]


class HeldOutEval:
    """The eval clips, their tokenized captions and the fixed caption derangements of one run."""

    def __init__(
        self,
        index: SplitIndex,
        tokenizer: Any,
        spec: ExampleSpec,
        unigram_logp: np.ndarray,
        *,
        n_derangements: int,
        seed: int,
        set_spans: list[tuple[str, int, int]] | None = None,
    ) -> None:
        """set_spans: (name, start, stop) clip rows of each shard set, for the per-set figures; None = one set."""
        self.index, self.spec, self.unigram_logp = index, spec, unigram_logp  # unigram_logp: [K, C]
        self.set_spans = set_spans if set_spans is not None else [("all", 0, len(index))]
        self.reader = ClipReader(index)
        self.tokenizer = tokenizer
        # texts and caption tokens at first use (the first report); codes are read per eval batch
        self._texts: list[str] | None = None
        self._captions: list[np.ndarray] | None = None
        # several derangements, averaged: with one, a clip's gain depends on which caption it happened to get
        shuffle_rng = np.random.default_rng([seed, 7])
        self.perms = [derangement(len(index), shuffle_rng) for _ in range(n_derangements)]
        self.n_frames = max_frames(spec.max_seq_len - spec.max_caption_tokens - 2, spec.pattern, spec.vocab.n_codebooks)
        self.music_lm: TargetCE | None = None  # score_music_lm
        self.teacher_true: TargetCE | None = None  # score_teacher: true and (averaged) deranged captions
        self.teacher_shuf: TargetCE | None = None
        self.teacher_status = "not scored (trainer.eval_teacher=false or the flatten pattern)"
        # scores the baselines above once before the first report (training.eval_setup)
        self.pending_baselines: Callable[[], None] | None = None

    @property
    def texts(self) -> list[str]:
        """Each eval clip's conditioning text (its json member only)."""
        if self._texts is None:
            self._texts = [
                conditioning_text(*self.reader.read_text_fields(i), self.spec.text) for i in range(len(self.index))
            ]
        return self._texts

    @property
    def captions(self) -> list[np.ndarray]:
        """Each eval clip's caption tokens."""
        if self._captions is None:
            self._captions = [
                np.asarray(caption_ids(self.tokenizer, None, self.spec, text=t), dtype=np.int64) for t in self.texts
            ]
        return self._captions

    def _batch(
        self,
        ids: list[int],
        caps: list[list[int]],
        clips: dict[int, Any],
        device: torch.device,
        crop: Literal["start", "end"] = "start",
    ) -> Batch:
        """The eval windows of clips `ids` reading captions `caps`, on `device` (crop="end": each clip's last frames)."""
        examples = [eval_example(self.spec, cap, clips[i], crop=crop) for cap, i in zip(caps, ids)]
        return collate(examples, pad_id=self.spec.pad_id).to(device)

    @torch.no_grad()
    def score_music_lm(self, audio_lm: torch.nn.Module, run: EvalRun) -> None:
        """Score the frozen music LM alone (no caption) on the reports' code targets, once (`self.music_lm`)."""
        self.music_lm = self._music_lm_run(audio_lm, None, None, run)

    @torch.no_grad()
    def score_teacher(self, teacher: Any, run: EvalRun) -> None:
        """Score MusicGen with its own text encoder (model.teacher.MusicgenTeacher) on the same targets with own and
        with the adapter's deranged captions (averaged), once: `self.teacher_true`, `self.teacher_shuf`."""
        teacher.eval()
        self.teacher_true = self._music_lm_run(teacher.decoder, teacher.condition, None, run)
        self.teacher_shuf = average_runs(
            [self._music_lm_run(teacher.decoder, teacher.condition, perm, run) for perm in self.perms]
        )
        self.teacher_status = f"MusicGen with its own text encoder ({teacher.source})"

    def _music_lm_run(
        self,
        decoder: torch.nn.Module,
        condition: Callable[[list[str], torch.device], tuple[torch.Tensor, torch.Tensor]] | None,
        perm: np.ndarray | None,
        run: EvalRun,
    ) -> TargetCE:
        """One pass of MusicGen's decoder over this rank's eval windows, gathered in clip order: unconditional
        (condition None), or reading clip i's caption (perm None) or clip perm[i]'s."""
        if self.spec.pattern != "delay":
            raise ValueError(f"the music LM baseline reads the delay pattern, not {self.spec.pattern!r}")
        decoder.eval()
        acc = CEAccumulator(self.spec.vocab.n_codebooks)
        mine = run.share(len(self.index))
        for ids in run.batches(mine):
            clips = {i: self.reader.read(i) for i in ids}
            batch = self._batch(ids, [self.captions[i].tolist() for i in ids], clips, run.device)
            cond: dict[str, torch.Tensor] = {}
            if condition is not None:
                texts = [self.texts[i if perm is None else int(perm[i])] for i in ids]
                states, mask = condition(texts, run.device)  # [B, T, d], [B, T]
                cond = {"encoder_hidden_states": states, "encoder_attention_mask": mask}
            with run.autocast():
                ce = music_lm_ce_per_target(decoder, batch, self.spec.vocab, **cond)  # [B, S, K]
            frames = target_frames(batch.tokens, batch.labels, vocab=self.spec.vocab, pattern=self.spec.pattern)
            is_code = frames >= 0  # [B, S, K] the code targets (END targets have no frame)
            acc.add(  # delay: slot k is codebook k, so the last axis is the per-codebook split (no bincount on MPS)
                (ce * is_code).sum((0, 1)),
                is_code.sum((0, 1)),
                (ce * is_code).sum((1, 2)),
                is_code.sum((1, 2)),
                per_frame_sums(ce, frames, self.n_frames),
            )
        return gather_target_ce(acc.result(self.n_frames), mine, len(self.index), run.all_gather)

    @torch.no_grad()
    def __call__(
        self,
        model: torch.nn.Module,
        run: EvalRun,
        *,
        step: int,
        n_bootstrap: int,
        seed: int,
        n_overlap_clips: int = 0,
    ) -> EvalReport:
        """Score this rank's share of the clips; returns the gathered report (the same on every rank)."""
        was_training = model.training
        model.eval()
        K = self.spec.vocab.n_codebooks
        passes = [("true", None), *((f"shuf{r}", perm) for r, perm in enumerate(self.perms))]
        sums = {name: CEAccumulator(K) for name in [*(n for n, _ in passes), "uni"]}
        end_sum, end_n = 0.0, 0
        n_eval = len(self.index)
        mine = run.share(n_eval)  # this rank's clips, each once
        for ids in run.batches(mine):
            clips = {i: self.reader.read(i) for i in ids}
            for name, perm in passes:
                caps = [self.captions[i if perm is None else int(perm[i])].tolist() for i in ids]
                batch = self._batch(ids, caps, clips, run.device)
                with run.autocast():
                    out = model.compute_loss(batch)
                frames = target_frames(batch.tokens, batch.labels, vocab=self.spec.vocab, pattern=self.spec.pattern)
                sums[name].add(
                    out.ce_sum_per_codebook,
                    out.count_per_codebook,
                    out.ce_sum_per_example,
                    out.count_per_example,
                    per_frame_sums(out.ce_per_target, frames, self.n_frames),  # [B, F] x2
                )
                if name == "true":
                    with run.autocast():  # only the END targets of the end windows count (one per clip)
                        end_out = model.compute_loss(self._batch(ids, caps, clips, run.device, crop="end"))
                    end_sum += float(end_out.end_ce_sum)
                    end_n += int(end_out.end_count)
                    u = unigram_ce(batch.labels, self.spec.vocab, self.unigram_logp)
                    sums["uni"].add(u.sum_per_codebook, u.count_per_codebook, u.sum_per_example, u.count_per_example)
        final = {
            k: gather_target_ce(v.result(0 if k == "uni" else self.n_frames), mine, n_eval, run.all_gather)
            for k, v in sums.items()
        }  # the unigram run has no per-frame sums (the gain by position compares the model's runs)
        end_parts = run.all_gather((end_sum, end_n))
        end_sum, end_n = sum(p[0] for p in end_parts), sum(p[1] for p in end_parts)
        model.train(was_training)
        shuffled = average_runs([final[name] for name, perm in passes if perm is not None])  # mean over derangements
        report = make_report(
            step=step,
            model_true=final["true"],
            model_shuf=shuffled,
            unigram=final["uni"],
            end_ce_sum=end_sum,
            end_count=end_n,
            n_bootstrap=n_bootstrap,
            seed=seed,
            n_overlap_clips=n_overlap_clips,
            music_lm=self.music_lm,
            teacher=(self.teacher_true, self.teacher_shuf) if self.teacher_true is not None else None,
        )
        report.teacher_status = self.teacher_status
        report.per_shard_set = per_set_figures(final["true"], shuffled, final["uni"], self.set_spans)
        return report

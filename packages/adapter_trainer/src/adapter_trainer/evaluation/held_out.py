"""Held-out clips for the learning check: refuse eval clips that are also train clips (`check_held_out`), and score
them: the model's CE with each clip's own caption, with deranged captions (the caption gain) and under the unigram
baseline, on exactly the same code targets.

Deterministic: every clip's sequence is `data.streaming.eval_example` (crop at the start, one audio budget whatever
the caption's length). AUDIO_END is scored where it exists: on a second window per clip that ends at the clip's
end (with its own caption), so the END CE is measured even when the start window never reaches an end. Under torchrun each rank scores its share of the clips once; the per-clip values are
gathered in clip order, so the bootstrap sees what one process computes. The model is only called
(`compute_loss`), never built here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

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
    """Refuse eval clips whose keys are also train keys (unless `allow_overlap`). Returns the overlap count.

    Args:
        where: the shard sets / splits, for the message (e.g. "data.train_split='train' / data.eval_split='train'").
    Raises:
        EvalOverlapError: the splits overlap and `allow_overlap` is False.
    """
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
    """[K, C] unigram log-probs of the codes of up to `max_clips` clips of `index`, evenly spaced (0 = all). An index
    from format-5 sidecars holds the code counts of all its clips: nothing is read, and max_clips does not apply."""
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
        # Captions once, as small int arrays (every derangement needs all of them), and their texts (what the
        # teacher's own tokenizer reads), at their first use (`texts`, `captions`): the first report, not before
        # step 1, which then reads no eval clip; codes are read per eval batch.
        self._texts: list[str] | None = None
        self._captions: list[np.ndarray] | None = None
        # Several derangements, averaged: one shuffle alone makes the per-clip gain depend on which caption a clip
        # happened to get (a same-instrument caption gains nothing), which widens the bootstrap interval.
        shuffle_rng = np.random.default_rng([seed, 7])
        self.perms = [derangement(len(index), shuffle_rng) for _ in range(n_derangements)]
        # Frames of the eval window (eval_example's fixed audio budget): the caption gain by position counts per frame.
        self.n_frames = max_frames(spec.max_seq_len - spec.max_caption_tokens - 2, spec.pattern, spec.vocab.n_codebooks)
        self.music_lm: TargetCE | None = None  # the frozen music LM alone on the same targets (score_music_lm)
        # MusicGen with its own text encoder on the same targets, true and (averaged) deranged captions (score_teacher)
        self.teacher_true: TargetCE | None = None
        self.teacher_shuf: TargetCE | None = None
        self.teacher_status = "not scored (trainer.eval_teacher=false or the flatten pattern)"
        # the baselines above, when the run scores them: called once before the first report (training.eval_setup)
        self.pending_baselines: Callable[[], None] | None = None

    @property
    def texts(self) -> list[str]:
        """Each eval clip's conditioning text, read once from its json member (no codes) at first use."""
        if self._texts is None:
            self._texts = [
                conditioning_text(*self.reader.read_text_fields(i), self.spec.text) for i in range(len(self.index))
            ]
        return self._texts

    @property
    def captions(self) -> list[np.ndarray]:
        """Each eval clip's caption tokens (caption_ids of its text), tokenized once at first use."""
        if self._captions is None:
            self._captions = [
                np.asarray(caption_ids(self.tokenizer, None, self.spec, text=t), dtype=np.int64) for t in self.texts
            ]
        return self._captions

    def _true_batch(self, ids: list[int], clips: dict[int, Any], device: torch.device) -> Batch:
        """The eval windows of clips `ids` with their own captions, on `device`."""
        examples = [eval_example(self.spec, self.captions[i].tolist(), clips[i]) for i in ids]
        return collate(examples, pad_id=self.spec.pad_id).to(device)

    @torch.no_grad()
    def score_music_lm(
        self,
        audio_lm: torch.nn.Module,
        *,
        batch_size: int,
        device: torch.device,
        autocast: Callable[[], contextlib.AbstractContextManager],
        rank: int = 0,
        world_size: int = 1,
        all_gather: Callable[[Any], list[Any]] = lambda x: [x],
    ) -> None:
        """Score the frozen music LM alone (a MusicgenForCausalLM, no caption) on exactly the code targets every
        report scores, once: it does not train, so each later report carries the same figures (`self.music_lm`)."""
        where = {"batch_size": batch_size, "device": device, "autocast": autocast}
        where |= {"rank": rank, "world_size": world_size, "all_gather": all_gather}
        self.music_lm = self._music_lm_run(audio_lm, None, None, **where)

    @torch.no_grad()
    def score_teacher(
        self,
        teacher: Any,
        *,
        batch_size: int,
        device: torch.device,
        autocast: Callable[[], contextlib.AbstractContextManager],
        rank: int = 0,
        world_size: int = 1,
        all_gather: Callable[[Any], list[Any]] = lambda x: [x],
    ) -> None:
        """Score MusicGen as it ships (a model.teacher.MusicgenTeacher: its decoder reading each caption through its
        own text encoder) on the same code targets, with each clip's own caption and with the same derangements as
        the adapter's caption gain (averaged), once: `self.teacher_true`, `self.teacher_shuf`."""
        where = {"batch_size": batch_size, "device": device, "autocast": autocast}
        where |= {"rank": rank, "world_size": world_size, "all_gather": all_gather}
        teacher.eval()
        self.teacher_true = self._music_lm_run(teacher.decoder, teacher.condition, None, **where)
        self.teacher_shuf = average_runs(
            [self._music_lm_run(teacher.decoder, teacher.condition, perm, **where) for perm in self.perms]
        )
        self.teacher_status = f"MusicGen with its own text encoder ({teacher.source})"

    def _music_lm_run(
        self,
        decoder: torch.nn.Module,
        condition: Callable[[list[str], torch.device], tuple[torch.Tensor, torch.Tensor]] | None,
        perm: np.ndarray | None,
        *,
        batch_size: int,
        device: torch.device,
        autocast: Callable[[], contextlib.AbstractContextManager],
        rank: int,
        world_size: int,
        all_gather: Callable[[Any], list[Any]],
    ) -> TargetCE:
        """One pass of MusicGen's decoder over this rank's eval windows, gathered in clip order: unconditional
        (condition None) or reading clip i's caption (perm None) / clip perm[i]'s (a derangement) via `condition`."""
        if self.spec.pattern != "delay":
            raise ValueError(f"the music LM baseline reads the delay pattern, not {self.spec.pattern!r}")
        decoder.eval()
        acc = CEAccumulator(self.spec.vocab.n_codebooks)
        mine = np.array_split(np.arange(len(self.index)), world_size)[rank]
        for start in range(0, len(mine), batch_size):
            ids = [int(i) for i in mine[start : start + batch_size]]
            batch = self._true_batch(ids, {i: self.reader.read(i) for i in ids}, device)
            cond: dict[str, torch.Tensor] = {}
            if condition is not None:
                texts = [self.texts[i if perm is None else int(perm[i])] for i in ids]
                states, mask = condition(texts, device)  # [B, T, d], [B, T]
                cond = {"encoder_hidden_states": states, "encoder_attention_mask": mask}
            with autocast():
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
        return gather_target_ce(acc.result(self.n_frames), mine, len(self.index), all_gather)

    @torch.no_grad()
    def __call__(
        self,
        model: torch.nn.Module,
        *,
        step: int,
        batch_size: int,
        device: torch.device,
        autocast: Callable[[], contextlib.AbstractContextManager],
        rank: int = 0,
        world_size: int = 1,
        all_gather: Callable[[Any], list[Any]] = lambda x: [x],
        n_bootstrap: int,
        seed: int,
        n_overlap_clips: int = 0,
    ) -> EvalReport:
        """Score this rank's share of the clips with `model` and return the gathered report (same on every rank).
        The model's train/eval mode is restored afterwards."""
        was_training = model.training
        model.eval()
        K = self.spec.vocab.n_codebooks
        runs = [("true", None), *((f"shuf{r}", perm) for r, perm in enumerate(self.perms))]
        sums = {name: CEAccumulator(K) for name in [*(n for n, _ in runs), "uni"]}
        end_sum, end_n = 0.0, 0
        n_eval = len(self.index)
        mine = np.array_split(np.arange(n_eval), world_size)[rank]  # this rank's clips, each once
        for start in range(0, len(mine), batch_size):
            ids = [int(i) for i in mine[start : start + batch_size]]
            clips = {i: self.reader.read(i) for i in ids}
            for name, perm in runs:
                caps = [self.captions[i if perm is None else int(perm[i])].tolist() for i in ids]
                examples = [eval_example(self.spec, cap, clips[i]) for cap, i in zip(caps, ids)]
                batch = collate(examples, pad_id=self.spec.pad_id).to(device)
                with autocast():
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
                    end_batch = collate(
                        [eval_example(self.spec, cap, clips[i], crop="end") for cap, i in zip(caps, ids)],
                        pad_id=self.spec.pad_id,
                    ).to(device)
                    with autocast():
                        end_out = model.compute_loss(end_batch)  # only its END targets count (one per clip)
                    end_sum += float(end_out.end_ce_sum)
                    end_n += int(end_out.end_count)
                    u = unigram_ce(batch.labels, self.spec.vocab, self.unigram_logp)
                    sums["uni"].add(u.sum_per_codebook, u.count_per_codebook, u.sum_per_example, u.count_per_example)
        # Per-clip values from every rank, in clip order: the bootstrap sees what one process would compute.
        final = {
            k: gather_target_ce(v.result(0 if k == "uni" else self.n_frames), mine, n_eval, all_gather)
            for k, v in sums.items()
        }  # the unigram run has no per-frame sums (the gain by position compares the model's runs)
        end_parts = all_gather((end_sum, end_n))
        end_sum, end_n = sum(p[0] for p in end_parts), sum(p[1] for p in end_parts)
        model.train(was_training)
        shuffled = average_runs([final[name] for name, perm in runs if perm is not None])  # mean over derangements
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

"""The run's held-out scoring (`HeldOutEval`), built once at setup: the unigram baseline from the train split and the
caption derangements (the eval captions and the frozen music LM alone on the same targets come at the first report:
a start reads no eval clip); before it, the checks on the two splits (`check_splits`); at a step, the run's report
(`held_out_report`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from adapter_trainer.config import ConfigError, DataConfig, ModelConfig, TrainerConfig
from adapter_trainer.data.shards import ShardSet
from adapter_trainer.data.split_index import SplitIndex
from adapter_trainer.data.streaming import ExampleSpec, distinct_texts
from adapter_trainer.evaluation.baseline_cache import (
    BASELINES,
    baseline_key,
    eval_set_sha256,
    files_sha256,
    load_baselines,
    save_baselines,
)
from adapter_trainer.evaluation.held_out import EvalRun, HeldOutEval, check_held_out, unigram_baseline
from adapter_trainer.evaluation.report import EvalReport
from adapter_trainer.training.checkpoint import TrainingProgress
from adapter_trainer.training.data_setup import eval_set_spans
from adapter_trainer.training.distributed import RankInfo

log = logging.getLogger(__name__)


def check_splits(d: DataConfig, train_index: SplitIndex, eval_index: SplitIndex) -> tuple[int, int]:
    """The train/eval overlap refusal (evaluation.held_out.check_held_out) and the eval split's size (the caption-gain
    check needs >= 2 clips). Returns (eval clips also in train, distinct conditioning texts of the train clips: the
    learning check's header)."""
    n_overlap_clips = check_held_out(
        (train_index.key(i) for i in range(len(train_index))),
        (eval_index.key(i) for i in range(len(eval_index))),
        allow_overlap=d.allow_eval_overlap,
        where=f"data.train_split={d.train_split!r} / data.eval_split={d.eval_split!r} in {d.shards}",
    )
    n_train_captions = distinct_texts(train_index, d.text)  # from the index's text digests, on every rank
    if len(eval_index) < 2:
        fix = (
            f"raise data.eval_max_clips={d.eval_max_clips} (0 scores the whole split; a split of fewer than 2 clips "
            f"needs more encoded)"
            if d.eval_max_clips == 1
            else "encode more clips into that split (stage 1: a larger limit, more audio, or other split settings), "
            "or point data.eval_split at a split with more"
        )
        raise ConfigError(
            f"split data.eval_split={d.eval_split!r} has {len(eval_index)} clip(s) in {d.shards}; the caption-gain "
            f"check needs at least 2: {fix}"
        )
    return n_overlap_clips, n_train_captions


def build_held_out(
    d: DataConfig,
    t: TrainerConfig,
    m: ModelConfig,
    train_index: SplitIndex,
    eval_index: SplitIndex,
    shard_sets: Sequence[ShardSet],
    tokenizer: object,
    spec: ExampleSpec,
    dist: RankInfo,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> HeldOutEval:
    """The held-out scoring of a run. With trainer.eval_music_lm (delay pattern), the audio LM alone (and with
    trainer.eval_teacher the teacher) is scored at the first report (`_score_baselines`), not before the first step."""
    # Unigram baseline from the train split ([K, C]): the index holds the split's code counts (every rank takes
    # them); when max_clips cut a set short rank 0 reads clips and all ranks get it.
    K, C = spec.vocab.n_codebooks, spec.vocab.codebook_size
    if train_index.code_counts is not None:
        unigram_logp = unigram_baseline(train_index, K, C)
    else:
        unigram_logp = dist.broadcast_object(
            unigram_baseline(train_index, K, C, d.unigram_max_clips) if dist.is_main else None
        )
    held_out = HeldOutEval(
        eval_index,
        tokenizer,
        spec,
        unigram_logp,
        n_derangements=t.eval_caption_shuffles,
        seed=t.seed,
        set_spans=eval_set_spans(d, shard_sets, len(eval_index)),
    )
    if t.eval_music_lm and d.pattern == "delay":
        # Scored at the first report, not here: loading MusicGen (and its T5) and scoring every eval clip is no part of
        # what a run needs before its first step (held_out_report runs it once, on every rank together).
        manifests = [s.manifest_sha256 for s in shard_sets]  # the codes scored: a set re-encoded is another key
        held_out.pending_baselines = lambda: _score_baselines(t, m, held_out, dist, device, autocast, manifests)
    return held_out


def _score_baselines(
    t: TrainerConfig,
    m: ModelConfig,
    held_out: HeldOutEval,
    dist: RankInfo,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager],
    manifests: list[str],
) -> None:
    """The frozen music LM alone (a fresh load of model.audio_lm: the MoT keeps only parts of it), then with
    trainer.eval_teacher MusicGen with its own text encoder; each scored on this rank's share and dropped. Kept in
    the run directory (evaluation.baseline_cache): a resumed run whose figures would be the same reads them (rank 0
    reads, every rank gets them)."""
    from adapter_trainer.model.builders import load_musicgen_decoder  # transformers' MusicGen: only when used

    identity = dist.broadcast_object(
        _baseline_identity(t, m, held_out, dist, device, manifests) if dist.is_main else None
    )
    path = Path(t.output_dir) / "baselines" / f"{baseline_key(**identity)}.npz" if identity else None
    kept = dist.broadcast_object(load_baselines(path) if dist.is_main and path else None)
    if kept is not None:
        for name in BASELINES:
            setattr(held_out, name, kept[name])
        held_out.teacher_status = kept["teacher_status"]
        if dist.is_main:
            log.info("baselines read from %s (scored by an earlier start in this run directory)", path)
        return
    run = _eval_run(t, dist, device, autocast)
    held_out.score_music_lm(load_musicgen_decoder(m.audio_lm, m.dtype).to(device), run)
    if t.eval_teacher:
        _score_teacher(m, held_out, run)
    if dist.is_main and path is not None:
        save_baselines(path, held_out, identity)


def _baseline_identity(
    t: TrainerConfig, m: ModelConfig, held_out: HeldOutEval, dist: RankInfo, device: torch.device, manifests: list[str]
) -> dict | None:
    """What the baselines' figures depend on (their cache key): the audio LM's files, the eval set, the windows and
    derangements, and what changes their floats."""
    import transformers

    from adapter_trainer.model.adapter_io import local_model_dir

    spec, eval_set = held_out.spec, eval_set_sha256(held_out.index)
    return {
        "audio_lm_files_sha256": files_sha256(local_model_dir(m.audio_lm)),
        "eval_set_sha256": eval_set,
        "shard_manifests_sha256": manifests,
        "window": [spec.pattern, spec.text, spec.max_seq_len, spec.max_caption_tokens, spec.vocab.n_codebooks],
        "derangements": [len(held_out.perms), t.seed],
        "teacher": t.eval_teacher,
        "floats": [
            m.dtype,
            t.precision,
            device.type,
            t.batch_size,
            dist.world_size,
            torch.__version__,
            transformers.__version__,
        ],
    }


def _eval_run(
    t: TrainerConfig, dist: RankInfo, device: torch.device, autocast: Callable[[], contextlib.AbstractContextManager]
) -> EvalRun:
    """This rank's share of a scoring pass, in micro-batches of trainer.batch_size."""
    return EvalRun(t.batch_size, device, autocast, dist.rank, dist.world_size, dist.all_gather_object)


def _score_teacher(m: ModelConfig, held_out: HeldOutEval, run: EvalRun) -> None:
    """Score MusicGen with its own text encoder (model/teacher.py), then drop it. A decoder-only checkpoint has no
    teacher: the report says so (teacher_status) and the run goes on; any other load failure stops the run."""
    from adapter_trainer.model.teacher import TeacherUnavailable, load_musicgen_teacher

    try:
        teacher = load_musicgen_teacher(m.audio_lm, m.dtype)
    except TeacherUnavailable as e:
        held_out.teacher_status = f"not scored: {e}"
        log.warning("teacher baseline %s", held_out.teacher_status)
        return
    except OSError as e:
        raise ConfigError(f"model.audio_lm={m.audio_lm}: {e}") from e
    held_out.score_teacher(teacher.to(run.device), run)


def held_out_report(
    held_out: HeldOutEval,
    model: torch.nn.Module,
    t: TrainerConfig,
    dist: RankInfo,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager],
    progress: TrainingProgress,
    *,
    n_overlap_clips: int,
    n_train_clips: int,
    n_train_captions: int,
) -> EvalReport:
    """The held-out report at progress.step: every rank scores its share of the eval clips, all ranks get the
    gathered report. It also carries what training saw so far (train clips, distinct captions, windows with an
    AUDIO_END target), set here: the scoring itself does not know it. t: the trainer section (batch size, bootstrap,
    seed)."""
    if held_out.pending_baselines is not None:  # the music-LM / teacher baselines, once, before the first report
        pending, held_out.pending_baselines = held_out.pending_baselines, None
        was_training = model.training
        pending()
        model.train(was_training)
    run = _eval_run(t, dist, device, autocast)
    report = held_out(
        model, run, step=progress.step, n_bootstrap=t.eval_bootstrap, seed=t.seed, n_overlap_clips=n_overlap_clips
    )
    report.n_train_clips, report.n_train_captions = n_train_clips, n_train_captions
    report.train_sequences, report.train_end_targets = progress.train_sequences, progress.train_end_targets
    return report

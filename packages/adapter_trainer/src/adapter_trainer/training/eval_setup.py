"""The run's held-out scoring (`HeldOutEval`), built once at setup: the eval captions, the unigram baseline from
the train split, the caption derangements, and the frozen music LM alone on the same targets."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from adapter_trainer.config import TrainConfig
from adapter_trainer.data.shards import ShardSet
from adapter_trainer.data.split_index import SplitIndex
from adapter_trainer.data.streaming import ExampleSpec
from adapter_trainer.evaluation.held_out import HeldOutEval, unigram_baseline
from adapter_trainer.training.data_setup import eval_set_spans
from adapter_trainer.training.distributed import RankInfo


def build_held_out(
    cfg: TrainConfig,
    train_index: SplitIndex,
    eval_index: SplitIndex,
    shard_sets: Sequence[ShardSet],
    tokenizer: object,
    spec: ExampleSpec,
    dist: RankInfo,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> HeldOutEval:
    """The held-out scoring of a run. With trainer.eval_music_lm (delay pattern), every rank scores its share of the
    eval clips with the audio LM alone (a fresh load of model.audio_lm: the MoT keeps only parts of it), then drops it."""
    # Unigram baseline from the train split: rank 0 reads, all ranks get it ([K, C]).
    unigram_logp = dist.broadcast_object(
        unigram_baseline(train_index, spec.vocab.n_codebooks, spec.vocab.codebook_size, cfg.data.unigram_max_clips)
        if dist.is_main
        else None
    )
    held_out = HeldOutEval(
        eval_index,
        tokenizer,
        spec,
        unigram_logp,
        n_derangements=cfg.trainer.eval_caption_shuffles,
        seed=cfg.trainer.seed,
        set_spans=eval_set_spans(cfg, shard_sets, len(eval_index)),
    )
    if cfg.trainer.eval_music_lm and cfg.data.pattern == "delay":
        from adapter_trainer.model.builders import load_musicgen_decoder  # transformers' MusicGen: only when used

        held_out.score_music_lm(
            load_musicgen_decoder(cfg.model.audio_lm, cfg.model.dtype).to(device),
            batch_size=cfg.trainer.batch_size,
            device=device,
            autocast=autocast,
            rank=dist.rank,
            world_size=dist.world_size,
            all_gather=dist.all_gather_object,
        )
    return held_out

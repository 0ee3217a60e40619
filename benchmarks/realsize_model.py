"""Shared by bench_memory.py and bench_gpu.py: a preset's config, the MoT model at real (or tiny) sizes with random
weights (built locally, nothing downloaded), a batch of full-length sequences, and one training step as the recipe
runs it (zero_grad, backward_accum_group under the preset's autocast, clip, AdamW step).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from transformers import LlamaForCausalLM, MusicgenForCausalLM

from adapter_trainer.config import TrainConfig, to_train_config
from adapter_trainer.data.token_layout import AudioVocab, Batch, collate, encode_example
from adapter_trainer.hydra_cli import find_conf_dir
from adapter_trainer.model.builders import (
    llama3_2_1b_config,
    mot_model,
    musicgen_small_decoder_config,
    tiny_llama_config,
    tiny_musicgen_decoder_config,
    upcast_trainable_to_fp32,
)
from adapter_trainer.model.mot import MoTAdapterModel
from adapter_trainer.training.device import autocast
from adapter_trainer.training.optim import build_optimizer
from adapter_trainer.training.step import backward_accum_group

BOS, PAD = 128_000, 128_001  # Llama 3.2's <|begin_of_text|>, <|end_of_text|>


def preset_config(experiment: str, *overrides: str) -> TrainConfig:
    """The typed config of +experiment=NAME with the placeholders filled and `overrides` applied."""
    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        return to_train_config(
            compose(
                "config",
                overrides=[
                    f"+experiment={experiment}",
                    "data.shards=[unused]",
                    "trainer.output_dir=unused",
                    *overrides,
                ],
            )
        )


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules directly in `dtype`: no fp32 copy of a bf16 tower ever exists (it would set the peak)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def build_model(cfg: TrainConfig, dims: str, device: torch.device | str) -> tuple[torch.nn.Module, AudioVocab]:
    """MoT adapter over random-weight towers: dims "real" = Llama-3.2-1B + musicgen-small sizes, "tiny" = demo sizes.

    Frozen towers in cfg.model.dtype, trainable tensors fp32 (as build_mot_model), on `device`,
    activation checkpointing as cfg.trainer.activation_checkpointing.
    """
    llm_cfg, audio_cfg = (
        (llama3_2_1b_config(), musicgen_small_decoder_config())
        if dims == "real"
        else (tiny_llama_config(), tiny_musicgen_decoder_config())
    )
    with default_dtype(getattr(torch, cfg.model.dtype)), torch.device(device):
        llm = LlamaForCausalLM(llm_cfg)
        audio_lm = MusicgenForCausalLM(audio_cfg)
    K, C = audio_lm.config.num_codebooks, audio_lm.config.vocab_size
    vocab = AudioVocab(text_vocab_size=llm.config.vocab_size, n_codebooks=K, codebook_size=C)
    model = mot_model(llm, audio_lm, vocab, cfg.data.pattern, cfg.model.mot)
    upcast_trainable_to_fp32(model)
    model.activation_checkpointing = cfg.trainer.activation_checkpointing
    return model.to(device), vocab


def full_batch(cfg: TrainConfig, vocab: AudioVocab, batch_size: int, seed: int = 0) -> Batch:
    """batch_size sequences of exactly data.max_seq_len positions (a max-length caption, then audio cropped to fit):
    the largest batch the preset can build, with no padding."""
    rng = np.random.default_rng(seed)
    d = cfg.data
    exs = []
    for i in range(batch_size):
        caption = [int(x) for x in rng.integers(1000, 100_000, size=d.max_caption_tokens)]
        codes = rng.integers(0, vocab.codebook_size, size=(d.max_seq_len, vocab.n_codebooks)).astype(np.int16)  # [T, K]
        exs.append(
            encode_example(
                caption,
                codes,
                vocab=vocab,
                pattern=d.pattern,
                bos_id=BOS,
                max_seq_len=d.max_seq_len,
                max_caption_tokens=d.max_caption_tokens,
                crop="start",
                rng=rng,
                key=f"row{i}",
            )
        )
    return collate(exs, pad_id=PAD)  # tokens [B, S, J], S = max_seq_len


def make_optimizer(model: MoTAdapterModel, cfg: TrainConfig) -> torch.optim.AdamW:
    trainable = [p for p in model.parameters() if p.requires_grad]
    return build_optimizer(trainable, model.pretrained_copy_parameters(), cfg.optimizer)


def train_step(
    model: MoTAdapterModel,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    cfg: TrainConfig,
    around_backward: contextlib.AbstractContextManager | None = None,
) -> float:
    """One optimizer step as the recipe runs it; returns the loss. `batch` must already be on the model's device.
    `around_backward` (e.g. a memory counter) is entered for forward + backward alone, after zero_grad."""
    device = next(model.parameters()).device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    with around_backward or contextlib.nullcontext():
        stats = backward_accum_group(model, [batch], autocast=lambda: autocast(cfg.trainer.precision, device))
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.optimizer.grad_clip)
    optimizer.step()
    return stats.loss

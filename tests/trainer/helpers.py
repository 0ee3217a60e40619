"""Shared helpers for the trainer tests: a tiny MoT model built in memory, a composed demo config, and a command's
`python -m` entry run in this process."""

from __future__ import annotations

import logging
import runpy
import sys
from pathlib import Path

import numpy as np
import torch

from adapter_trainer.config import TrainConfig, to_train_config
from adapter_trainer.data.token_layout import AudioVocab, Example, encode_example
from adapter_trainer.hydra_cli import find_conf_dir

TEXT_VOCAB = 1000  # small text vocab for in-memory models (the demo models keep Llama 3's 128,256)


def tiny_mot(pattern: str = "delay", lora_rank: int = 0, dtype: torch.dtype = torch.float32, seed: int = 0):
    """A tiny MoTAdapterModel (random init, frozen towers in `dtype`) and its AudioVocab."""
    from transformers import LlamaForCausalLM, MusicgenForCausalLM

    from adapter_trainer.model.builders import tiny_llama_config, tiny_musicgen_decoder_config
    from adapter_trainer.model.mot import MoTAdapterModel, MoTConfig

    torch.manual_seed(seed)
    lc = tiny_llama_config()
    lc.vocab_size = TEXT_VOCAB
    llm = LlamaForCausalLM(lc).to(dtype)
    mg = MusicgenForCausalLM(tiny_musicgen_decoder_config()).to(dtype)
    vocab = AudioVocab(text_vocab_size=TEXT_VOCAB, n_codebooks=4, codebook_size=2048)
    cfg = (
        MoTConfig(audio_tower="llm", audio_attention="lora", lora_rank=lora_rank)
        if lora_rank
        else MoTConfig(audio_tower="llm")
    )
    return MoTAdapterModel(llm, mg, vocab, pattern, cfg), vocab


def example(vocab: AudioVocab, n_caption: int, n_frames: int, seed: int, pattern: str = "delay") -> Example:
    """One encoded example with a caption of `n_caption` ids and `n_frames` frames of random codes."""
    rng = np.random.default_rng(seed)
    caption = [int(x) for x in rng.integers(3, TEXT_VOCAB, size=n_caption)]
    codes = rng.integers(0, vocab.codebook_size, size=(n_frames, vocab.n_codebooks)).astype(np.int16)  # [T, K]
    return encode_example(
        caption,
        codes,
        vocab=vocab,
        pattern=pattern,
        bos_id=1,
        max_seq_len=256,
        max_caption_tokens=32,
        crop="start",
        rng=rng,
        key=f"k{seed}",
    )


def tiny_demo_overrides(models: dict[str, Path], shards: Path, out: Path, *extra: str) -> list[str]:
    """Hydra overrides for +experiment=demo on the tiny demo models and a synthetic shard set: 48-token windows,
    batch 2, a log line every step, no eval or checkpoint during training, no progress bar, no TensorBoard.
    `extra` comes last, so it wins over these (Hydra applies overrides in order)."""
    return [
        "+experiment=demo",
        f"model.llm={models['llm']}",
        f"model.audio_lm={models['musicgen']}",
        f"data.shards=[{shards}]",
        f"trainer.output_dir={out}",
        "data.max_seq_len=48",
        "data.max_caption_tokens=12",
        "trainer.batch_size=2",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.ckpt_every=0",
        "trainer.progress_bar=false",
        "trainer.tensorboard=false",
        *extra,
    ]


def make_cfg(models: dict[str, Path], shards: Path, out: Path, *overrides: str) -> TrainConfig:
    """The composed TrainConfig of `tiny_demo_overrides` (200 bootstrap draws, 1 derangement, CPU) plus overrides."""
    from hydra import compose, initialize_config_dir

    base = tiny_demo_overrides(
        models,
        shards,
        out,
        "trainer.eval_bootstrap=200",
        "trainer.eval_caption_shuffles=1",
        "optimizer.warmup_steps=3",
        "trainer.device=cpu",
    )
    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        return to_train_config(compose("config", overrides=base + list(overrides)))


def record_batch_keys(recipe) -> list[list[str]]:
    """Wrap this recipe's public `next_train_batch`: the returned list fills with the clip keys of every
    micro-batch this rank trains on (the recipe itself keeps no such record)."""
    seen: list[list[str]] = []
    fetch = recipe.next_train_batch

    def next_train_batch(batches):
        batch = fetch(batches)
        seen.append(list(batch.keys))
        return batch

    recipe.next_train_batch = next_train_batch
    return seen


def run_recipe_recording_keys(cfg: TrainConfig) -> tuple[dict, list[list[str]]]:
    """setup -> train -> cleanup as `recipe_main` runs them; returns (final metrics, keys of every micro-batch)."""
    from adapter_trainer.training.distributed import teardown_distributed
    from adapter_trainer.training.recipe import MoTAdapterRecipe

    recipe = MoTAdapterRecipe(cfg)
    try:
        recipe.setup()
        seen = record_batch_keys(recipe)
        recipe.train()
        return recipe.cleanup(), seen
    finally:
        teardown_distributed()


def run_module_in_process(module: str, *args: str) -> int:
    """`python -m module *args` in this process, as `python -m` runs it (runpy, `__main__`): its exit status (0 when
    it returns). Callers read stdout/stderr with capfd. For tests about a command's config and messages, not its
    process: a subprocess pays ~3-6 s of imports. The root logger Hydra configures for the run is put back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    argv = sys.argv
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.argv = argv
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers[:] = handlers
        root.setLevel(level)

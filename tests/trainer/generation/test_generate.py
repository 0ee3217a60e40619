"""`adapter_trainer.generate` on the tiny demo models + synthetic shards: a 2-step run's checkpoint, sampled with
the real MoT KV cache; the set it writes passes verify and the trainer's reader; reruns reproduce; a checkpoint
of other data is refused; the CLI process never imports the codec; caption dropout reaches the batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from adapter_trainer.data.samples import load_split
from adapter_trainer.data.shards import read_manifest
from adapter_trainer.generation.config import GenerateRunConfig
from adapter_trainer.generation.generate import run_generate, to_generate_config
from adapter_trainer.hydra_cli import find_conf_dir
from adapter_trainer.training.checkpoint import ResumeError
from tests import REPO
from tests.contract.shard_fixture import write_synthetic_set
from tests.trainer.helpers import tiny_demo_overrides


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_set(tmp_path_factory.mktemp("shards") / "set", n_train=12, n_eval=4, frames=(12, 24))


def overrides(models: dict[str, Path], shards: Path, out: Path) -> list[str]:
    return tiny_demo_overrides(
        models, shards, out, "trainer.eval_bootstrap=50", "optimizer.warmup_steps=1", "data.caption_dropout=0.5"
    )


def compose(config: str, args: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        return hydra_compose(config, overrides=args)


@pytest.fixture(scope="module")
def run_dir(models, shards, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from adapter_trainer.config import to_train_config
    from adapter_trainer.training.recipe import recipe_main

    out = tmp_path_factory.mktemp("run") / "run"
    recipe_main(to_train_config(compose("config", overrides(models, shards, out) + ["trainer.max_steps=2"])))
    return out


def gen_cfg(models, shards, run_dir: Path, *extra: str) -> GenerateRunConfig:
    return to_generate_config(
        compose(
            "generate",
            overrides(models, shards, run_dir)
            + ["generate.n=3", "generate.seconds=0.2", "generate.batch_size=2", "generate.overwrite=true", *extra],
        )
    )


def test_generate_writes_a_verified_reproducible_set(models, shards, run_dir: Path, tmp_path: Path) -> None:
    from tokenizer_pipeline.shards.verify import verify

    stats = run_generate(gen_cfg(models, shards, run_dir, f"generate.out_dir={tmp_path / 'a'}"))
    assert stats["clips"] == 3 and stats["positions_per_s"] > 0
    problems, summary = verify(tmp_path / "a")
    assert problems == [], problems
    clips = load_split([read_manifest(tmp_path / "a")], "generated")
    eval_clips = load_split([read_manifest(shards)], "eval")
    assert [c.caption for c in clips] == [c.caption for c in eval_clips[:3]]
    assert all(1 <= c.codes.shape[0] <= 10 for c in clips)  # 0.2 s at 50 Hz
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert m["codec"] == json.loads((shards / "manifest.json").read_text())["codec"]
    assert m["generated"]["checkpoint_step"] == 2 and m["generated"]["sampling"]["cfg_scale"] == 3.0
    assert [c["source_key"] for c in m["generated"]["captions"]] == [c.key for c in eval_clips[:3]]
    lines = (tmp_path / "a" / "captions.jsonl").read_text(encoding="utf-8").splitlines()  # for audio_metrics
    assert [json.loads(line) for line in lines] == [
        {"key": c.key, "caption": c.caption, "source_key": e.key} for c, e in zip(clips, eval_clips)
    ]
    # same seed -> the same codes, also with another batch size (other seeds: tests/trainer/generation/test_sampling.py)
    run_generate(gen_cfg(models, shards, run_dir, f"generate.out_dir={tmp_path / 'b'}", "generate.batch_size=3"))
    again = load_split([read_manifest(tmp_path / "b")], "generated")
    for x, y in zip(clips, again):
        np.testing.assert_array_equal(x.codes, y.codes)


class FullRecompute:
    """forward_step without a cache: recompute the whole history every call (the slow reference)."""

    def __init__(self, model) -> None:
        self.model = model

    def forward_step(self, tokens, is_audio, attention_mask, cache):
        hist_t = tokens if cache is None else torch.cat([cache[0], tokens], 1)
        hist_a = is_audio if cache is None else torch.cat([cache[1], is_audio], 1)
        logits, _ = self.model.forward_step(hist_t, hist_a, attention_mask, None)
        return logits[:, -tokens.shape[1] :], (hist_t, hist_a)


def test_kv_cache_sampling_equals_full_recompute(models) -> None:
    from adapter_trainer.data.token_layout import AudioVocab
    from adapter_trainer.generation.sampling import SamplingConfig, generate_codes
    from adapter_trainer.model.builders import load_llm, load_musicgen_decoder
    from adapter_trainer.model.mot import MoTAdapterModel, MoTConfig

    torch.manual_seed(0)
    llm, mg = load_llm(models["llm"]), load_musicgen_decoder(models["musicgen"])
    vocab = AudioVocab(llm.config.vocab_size, mg.config.num_codebooks, mg.config.vocab_size)
    model = MoTAdapterModel(
        llm, mg, vocab, "delay", MoTConfig(audio_tower="llm", audio_embed_init="random", audio_head_init="random")
    ).eval()
    with torch.no_grad():  # non-zero experts, so audio rows really differ from text rows
        for layer in model.layers:
            layer.audio.up.weight.normal_(0, 0.05)
    captions = [[100, 200, 300, 400], [500], [600, 700]]  # different lengths: left padding + CFG rows
    kw = dict(
        vocab=vocab,
        pattern="delay",
        bos_id=128000,
        pad_id=128001,
        max_frames=6,
        row_seeds=[1, 2, 3],
        sampling=SamplingConfig(temperature=0.0, top_k=0, cfg_scale=3.0),
    )
    fast = generate_codes(model, captions, **kw)
    slow = generate_codes(FullRecompute(model), captions, **kw)
    for a, b in zip(fast.codes, slow.codes):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_of_other_data_is_refused(models, shards, run_dir: Path, tmp_path: Path) -> None:
    other = write_synthetic_set(tmp_path / "other", n_train=4, n_eval=3, frames=(12, 24), seed=5)
    cfg = to_generate_config(
        compose("generate", overrides(models, other, run_dir) + ["generate.n=3", f"generate.out_dir={tmp_path / 'x'}"])
    )
    with pytest.raises(ResumeError, match="data.manifest_sha256"):
        run_generate(cfg)
    assert not (tmp_path / "x").exists()


def test_cli_process_never_imports_the_codec(models, shards, run_dir: Path, tmp_path: Path) -> None:
    args = overrides(models, shards, run_dir) + [
        "generate.n=2",
        "generate.seconds=0.1",
        f"generate.out_dir={tmp_path / 'g'}",
    ]
    code = (
        "import runpy, sys, json; sys.argv = ['generate'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('adapter_trainer.generate', run_name='__main__')\n"
        "finally:\n    print('MODULES ' + json.dumps(sorted(sys.modules)))"
    )
    env = {k: v for k, v in os.environ.items() if k != "ADAPTER_TRAINER_CONF_DIR"}
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    mods = json.loads(proc.stdout.split("MODULES ", 1)[1])
    assert "adapter_trainer.model.mot" in mods and "adapter_trainer.generation.sampling" in mods
    assert not [m for m in mods if m.startswith(("tokenizer_pipeline", "transformers.models.encodec"))]
    assert "positions/s" in proc.stdout and (tmp_path / "g" / "manifest.json").is_file()
    assert not (run_dir / ".hydra").exists() and not (REPO / ".hydra").exists()  # sampling writes no Hydra run dir
    bad = subprocess.run(
        [sys.executable, "-m", "adapter_trainer.generate", *args, "generate.captions=nope"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert bad.returncode == 2 and "generate.captions='nope'" in bad.stderr and "Traceback" not in bad.stderr


def test_caption_dropout_empties_some_training_captions(models, shards, tmp_path: Path) -> None:
    from adapter_trainer.config import to_train_config
    from adapter_trainer.data.caption_dropout import drop_caption
    from adapter_trainer.training.recipe import MoTAdapterRecipe

    rng = np.random.default_rng(0)
    assert drop_caption([1, 2], 0.0, rng) == [1, 2] and rng.random() == np.random.default_rng(0).random()  # no draw
    assert sum(drop_caption([1], 0.3, rng) == [] for _ in range(2000)) == pytest.approx(600, abs=80)
    with pytest.raises(ValueError, match="data.caption_dropout"):
        drop_caption([1], 1.0, rng)

    def empty_captions(p: float) -> int:
        cfg = to_train_config(
            compose(
                "config",
                overrides(models, shards, tmp_path / f"r{p}")
                + [f"data.caption_dropout={p}", "trainer.batch_size=12", "trainer.num_workers=0"],
            )
        )
        recipe = MoTAdapterRecipe(cfg)
        recipe.setup()
        batch = recipe.next_train_batch(recipe.train_batches())  # [B, S, J]: BOS then AUDIO_START = the empty caption
        return int((batch.tokens[:, 1, 0] == recipe.vocab.audio_start).sum())

    assert empty_captions(0.0) == 0
    assert 1 <= empty_captions(0.5) <= 11


def test_cfg_needs_a_trained_empty_caption(tmp_path: Path) -> None:
    """cfg_scale != 1 on a checkpoint trained with data.caption_dropout=0 is refused unless allowed explicitly."""
    from adapter_trainer.config import ConfigError
    from adapter_trainer.generation.config import GenerateConfig
    from adapter_trainer.generation.generate import check_uncond_trained

    (tmp_path / "config.yaml").write_text("data:\n  caption_dropout: 0.0\n")
    with pytest.raises(ConfigError, match="caption_dropout=0.*allow_untrained_uncond=true") as e:
        check_uncond_trained(GenerateConfig(cfg_scale=3.0), tmp_path)
    assert "\n" not in str(e.value)
    check_uncond_trained(GenerateConfig(cfg_scale=1.0), tmp_path)  # no guidance: nothing to refuse
    check_uncond_trained(GenerateConfig(cfg_scale=3.0, allow_untrained_uncond=True), tmp_path)
    (tmp_path / "config.yaml").write_text("data:\n  caption_dropout: 0.1\n")
    check_uncond_trained(GenerateConfig(cfg_scale=3.0), tmp_path)


def test_generation_runs_at_the_training_precision(models, shards, tmp_path: Path, monkeypatch) -> None:
    """A bf16 run (model.dtype=bfloat16, trainer.precision=bf16): sampling sees fp32 trainable weights, bf16 frozen
    towers and bf16 autocast, as the training step does (before, the whole adapter ran in bf16, no autocast)."""
    from adapter_trainer.config import to_train_config
    from adapter_trainer.generation import sampling
    from adapter_trainer.training.recipe import recipe_main

    bf16 = ["model.dtype=bfloat16", "trainer.precision=bf16"]
    out = tmp_path / "run"
    recipe_main(to_train_config(compose("config", overrides(models, shards, out) + ["trainer.max_steps=1", *bf16])))
    seen = {}
    real = sampling.generate_codes

    def spy(model, *args, **kwargs):
        seen["trainable"] = {p.dtype for p in model.parameters() if p.requires_grad}
        seen["frozen"] = {p.dtype for p in model.parameters() if not p.requires_grad}
        seen["autocast"] = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(sampling, "generate_codes", spy)
    run_generate(gen_cfg(models, shards, out, f"generate.out_dir={tmp_path / 'g'}", "generate.n=2", *bf16))
    assert seen["trainable"] == {torch.float32} and seen["frozen"] == {torch.bfloat16}
    assert seen["autocast"] == (True, torch.bfloat16)


@pytest.mark.parametrize("index", [0, 12345])
def test_generated_keys_follow_the_key_rule_for_every_valid_source_key(index: int) -> None:
    """A source clip's key may be as long as the rule allows (90); the generated clip's key must still be valid
    and name its row (else the whole run is sampled and then refused when the set is written)."""
    from adapter_trainer.data.sample_keys import MAX_KEY_LEN, key_problem
    from adapter_trainer.generation.generate import generated_key

    for key in [generated_key(index, src) for src in ["a" * MAX_KEY_LEN, "a" * (MAX_KEY_LEN - 1), "x_-9", ""]]:
        assert key_problem(key) is None, key
        assert key.startswith(f"gen-{index:04d}")
    assert generated_key(index, "") == f"gen-{index:04d}"
    assert generated_key(index, "abc") == f"gen-{index:04d}-abc"
    long = "b" * MAX_KEY_LEN
    assert generated_key(index, long) != generated_key(index + 1, long)  # rows stay apart after the cut


@pytest.mark.parametrize(
    ("key", "value"),
    [("seconds", float("nan")), ("seconds", float("inf")), ("temperature", float("nan")),
     ("temperature", float("inf")), ("cfg_scale", float("nan")), ("cfg_scale", float("-inf"))],
)  # fmt: skip
def test_generate_refuses_settings_that_are_not_finite_numbers(key: str, value: float) -> None:
    """nan seconds crashed (int(round(nan))); nan temperature silently meant greedy; nan cfg_scale sampled from NaN
    logits. Each is refused in one line naming the setting."""
    from adapter_trainer.config import ConfigError
    from adapter_trainer.generation.config import GenerateConfig, validate_generate

    g = GenerateConfig(**{key: value})
    with pytest.raises(ConfigError, match=f"generate.{key}="):
        validate_generate(g)
    validate_generate(GenerateConfig())  # the defaults pass


def test_generate_n_0_takes_every_caption_once_and_is_the_default(tmp_path: Path) -> None:
    """generate.n=0 (the default: the probe needs every eval caption for its power) = the whole eval split, or each
    line of a captions file once; n=N the first N (eval) or N cycling (file); n < 0 is refused naming the key."""
    from adapter_trainer.config import ConfigError
    from adapter_trainer.data.samples import Clip
    from adapter_trainer.generation.config import GenerateConfig, validate_generate
    from adapter_trainer.generation.generate import _caption_rows

    assert GenerateConfig().n == 0
    assert compose("generate", []).generate.n == 0  # the YAML agrees with the schema
    clips = [
        Clip(key=f"k{i}", caption=f"caption {i}", aspects=("a",), codes=np.zeros((2, 4), np.int16)) for i in range(5)
    ]
    cfg = GenerateRunConfig()
    assert [r["source_key"] for r in _caption_rows(cfg, clips)] == [f"k{i}" for i in range(5)]
    cfg.generate.n = 3
    assert [r["caption"] for r in _caption_rows(cfg, clips)] == ["caption 0", "caption 1", "caption 2"]
    with pytest.raises(ConfigError, match="generate.n=0 but split"):
        _caption_rows(GenerateRunConfig(), [])
    (tmp_path / "caps.txt").write_text("calm piano\n\nfast drums\n")
    cfg = GenerateRunConfig(generate=GenerateConfig(captions="file", captions_file=str(tmp_path / "caps.txt")))
    assert [r["caption"] for r in _caption_rows(cfg, [])] == ["calm piano", "fast drums"]
    cfg.generate.n = 3
    assert [r["caption"] for r in _caption_rows(cfg, [])] == ["calm piano", "fast drums", "calm piano"]
    with pytest.raises(ConfigError, match="generate.n=-1 must be >= 0"):
        validate_generate(GenerateConfig(n=-1))

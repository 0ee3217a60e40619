"""`model.mot.audio_tower=musicgen` through the whole product: config refusals, a run (learning check, checkpoint,
exact resume), generation from the run and from an exported folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from adapter_trainer.config import ConfigError
from adapter_trainer.training.metric_logging import read_jsonl
from adapter_trainer.training.recipe import MoTAdapterRecipe, recipe_main
from tests.trainer.helpers import make_cfg

TOWER = "model.mot.audio_tower=musicgen"
# the settings make_cfg adds to tiny_demo_overrides (a checkpoint is sampled only with the settings it trained with)
AS_MAKE_CFG = ("trainer.eval_bootstrap=200", "trainer.eval_caption_shuffles=1", "optimizer.warmup_steps=3",
               "trainer.device=cpu")  # fmt: skip


def test_at_init_the_adapter_scores_what_the_music_lm_alone_scores(models, shards, tmp_path: Path) -> None:
    """Before any step the variant IS MusicGen on the audio rows: its eval CE equals the learning check's "music LM
    alone" up to the AUDIO_END logit it adds to each softmax (one extra class of ~2049)."""
    recipe = MoTAdapterRecipe(make_cfg(models, shards, tmp_path / "run", TOWER))
    recipe.setup()
    r = recipe.evaluate()
    assert abs(r.ce - r.music_lm_ce) < 2e-3, (r.ce, r.music_lm_ce)
    assert r.caption_gain == pytest.approx(0.0, abs=1e-6)  # closed gates: the caption reaches nothing


@pytest.mark.parametrize(
    "override",
    ["data.pattern=flatten", "model.mot.audio_attention=separate", "model.mot.audio_embed_init=random"],
)
def test_the_llm_towers_knobs_are_refused_with_the_fix(models, shards, tmp_path: Path, override: str) -> None:
    with pytest.raises(ConfigError, match=r"audio_tower=musicgen runs MusicGen's own layers.*set them back"):
        make_cfg(models, shards, tmp_path / "run", TOWER, override)


def test_train_resume_generate_and_export(models, shards, tmp_path: Path) -> None:
    from adapter_trainer.generation.generate import run_generate, to_generate_config
    from adapter_trainer.sharing.export import export_adapter
    from tests.trainer.generation.test_generate import compose
    from tests.trainer.helpers import tiny_demo_overrides

    out = tmp_path / "run"
    straight_run = tmp_path / "straight"
    straight = recipe_main(make_cfg(models, shards, straight_run, TOWER, "trainer.max_steps=4", "trainer.ckpt_every=2"))
    # a run dir that holds only the straight run's step-2 checkpoint, resumed with `latest`
    shutil.copytree(straight_run / "checkpoints" / "step-000002", out / "checkpoints" / "step-000002")
    resumed = recipe_main(make_cfg(models, shards, out, TOWER, "trainer.max_steps=4", "trainer.resume=latest"))
    assert resumed["learning_check"]["eval_ce"] == pytest.approx(straight["learning_check"]["eval_ce"], rel=1e-5)
    from safetensors.torch import load_file

    state = load_file(str(out / "checkpoints" / "step-000004" / "adapter.safetensors"))
    assert all(bool(state[f"caption.{m}.proj.weight"].abs().sum() > 0) for m in range(6))  # zero_proj: it opened
    # caption_scale: logged with the train metrics from 0 (zero_proj) upwards, and kept in final_metrics.json
    scales = [r["train/caption_scale"] for r in read_jsonl(straight_run / "metrics.jsonl") if "train/loss" in r]
    assert len(scales) == 4 and 0.0 < scales[0] < scales[-1], scales
    assert straight["caption_scale"] == pytest.approx(scales[-1])
    assert json.loads((straight_run / "final_metrics.json").read_text())["caption_scale"] == pytest.approx(scales[-1])
    assert any(k.startswith("decoder.layers.0.encoder_attn.") for k in state)  # MusicGen's cross-attention trained
    gen = to_generate_config(
        compose("generate", tiny_demo_overrides(models, shards, out, *AS_MAKE_CFG, TOWER, "generate.n=2",
                                                 "generate.seconds=0.2", f"generate.out_dir={tmp_path / 'gen'}"))
    )  # fmt: skip
    stats = run_generate(gen)
    assert stats["clips"] == 2 and (tmp_path / "gen" / "manifest.json").is_file()
    folder = export_adapter(out, tmp_path / "adapter")
    assert '"audio_tower": "musicgen"' in (folder / "adapter_config.json").read_text()
    from_folder = to_generate_config(
        compose("generate", [f"generate.adapter={folder}", "generate.captions=file", "generate.seconds=0.2",
                             f"generate.captions_file={_captions(tmp_path)}", f"generate.out_dir={tmp_path / 'gen2'}",
                             "trainer.device=cpu"])
    )  # fmt: skip
    assert run_generate(from_folder)["clips"] == 1


def _captions(tmp_path: Path) -> Path:
    f = tmp_path / "captions.txt"
    f.write_text("calm solo piano\n")
    return f

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
    ["data.pattern=flatten", "model.mot.audio_attention=separate", "model.mot.audio_embed_init=random",
     "model.mot.caption_cond_rank=4"],
)  # fmt: skip
def test_the_llm_towers_knobs_are_refused_with_the_fix(models, shards, tmp_path: Path, override: str) -> None:
    with pytest.raises(ConfigError, match=r"audio_tower=musicgen runs MusicGen's own layers.*set them back"):
        make_cfg(models, shards, tmp_path / "run", TOWER, override)


def test_a_layer_map_of_the_wrong_length_is_one_line(models, shards, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="one entry per MusicGen layer"):
        MoTAdapterRecipe(make_cfg(models, shards, tmp_path / "run", TOWER, "model.mot.layer_map=[0,1]")).setup()


@pytest.mark.parametrize(
    "overrides,match",
    [((TOWER, "model.mot.caption_projection=shared", "model.mot.layer_map=[0,0,1,1,2,3]"), "drop model.mot.layer_map"),
     ((TOWER, "model.mot.caption_layer=2"), "caption_projection=shared only"),
     ((TOWER, "model.mot.caption_init=zeros"), "choose one of zero_proj, zero_gate"),
     ((TOWER, "model.mot.cross_attention=lora"), "choose one of train, freeze"),
     (("model.mot.cross_attention=freeze",), "belong to model.mot.audio_tower=musicgen"),
     (("model.mot.caption_projection=shared",), "set model.mot.audio_tower=musicgen")],
)  # fmt: skip
def test_the_caption_path_keys_are_checked_in_one_line(models, shards, tmp_path: Path, overrides, match) -> None:
    with pytest.raises(ConfigError, match=match):
        make_cfg(models, shards, tmp_path / "run", *overrides)


def test_the_fingerprint_and_old_exports_read_the_caption_path_as_its_checkpoints_before_it(
    models, shards, tmp_path: Path
) -> None:
    """Checkpoints of the musicgen tower written before caption_init existed were zero_gate: its keys are recorded only
    where they differ from that (so those resume with caption_init=zero_gate, and a zero_proj run never loads their
    tanh gates as plain ones), and never with the llm tower; an exported folder without caption_init reads zero_gate."""
    from adapter_trainer.data.token_layout import AudioVocab
    from adapter_trainer.model.adapter_io import adapter_train_config
    from adapter_trainer.training.checkpoint import run_fingerprint

    class NoTensors:
        def trainable_state_dict(self) -> dict:
            return {}

    def mot(*overrides: str) -> dict:
        cfg = make_cfg(models, shards, tmp_path / "run", *overrides)
        return run_fingerprint(cfg, AudioVocab(1000, 4, 2048), NoTensors(), [])["model.mot"]

    assert not {"caption_init", "caption_projection", "caption_layer", "cross_attention"} & set(mot())  # llm
    assert mot(TOWER)["caption_init"] == "zero_proj"
    assert "caption_init" not in mot(TOWER, "model.mot.caption_init=zero_gate")
    shared = mot(TOWER, "model.mot.caption_projection=shared", "model.mot.caption_layer=1")
    assert (shared["caption_projection"], shared["caption_layer"]) == ("shared", 1)
    exported = {
        "base_models": {"llm": {"name_or_path": "llm"}, "audio_lm": {"name_or_path": "mg"}},
        "token_layout": {"pattern": "delay"},
        "captions": {"text": "caption", "max_caption_tokens": 8, "max_seq_len": 64, "caption_dropout": 0.1},
        "precision": {"frozen_dtype": "float32", "train": "fp32"},
        "model": {"mot": {"audio_tower": "musicgen"}},
    }
    assert adapter_train_config(exported).model.mot.caption_init == "zero_gate"
    exported["model"]["mot"] = {"audio_tower": "llm"}
    assert adapter_train_config(exported).model.mot.caption_init == "zero_proj"  # the schema's, unused by llm


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


def test_a_checkpoint_from_before_special_code_embed_samples_but_does_not_resume(
    models, shards, tmp_path: Path
) -> None:
    """Checkpoints written before AUDIO_START/PAD/END read MusicGen's rows lack special_code_embed: generation loads
    them as they were (zero rows), a resume is refused in one line naming it (its AdamW groups hold one tensor less)."""

    import torch
    from safetensors.torch import load_file, save_file

    from adapter_trainer.generation.generate import run_generate, to_generate_config
    from adapter_trainer.training.checkpoint import ResumeError
    from tests.trainer.generation.test_generate import compose
    from tests.trainer.helpers import tiny_demo_overrides

    out = tmp_path / "run"
    recipe_main(make_cfg(models, shards, out, "trainer.max_steps=2", "trainer.ckpt_every=2"))
    ckpt = out / "checkpoints" / "step-000002"
    state = load_file(str(ckpt / "adapter.safetensors"))
    del state["special_code_embed"]
    save_file(state, str(ckpt / "adapter.safetensors"), metadata={"format": "pt"})
    fp = json.loads((ckpt / "fingerprint.json").read_text())
    del fp["trainable_shapes"]["special_code_embed"]
    (ckpt / "fingerprint.json").write_text(json.dumps(fp))
    opt = torch.load(ckpt / "optimizer.pt", weights_only=False)
    group = next(g for g in reversed(opt["param_groups"]) if g["params"])  # the copies' (special_code_embed's)
    group["params"] = group["params"][:-1]  # the old model's groups held one tensor less
    torch.save(opt, ckpt / "optimizer.pt")
    gen = to_generate_config(
        compose("generate", tiny_demo_overrides(models, shards, out, *AS_MAKE_CFG, "generate.n=1",
                                                 "generate.seconds=0.2", f"generate.out_dir={tmp_path / 'gen'}"))
    )  # fmt: skip
    assert run_generate(gen)["clips"] == 1
    with pytest.raises(ResumeError, match="special_code_embed"):
        recipe_main(make_cfg(models, shards, out, "trainer.max_steps=4", "trainer.resume=latest"))

"""The Python API (`adapter_trainer.MoTAdapter`) on an exported 2-step run of the tiny demo models: one call loads the
folder and its towers; `generate` gives the codes `python -m adapter_trainer.generate` writes for the same captions,
settings and seed, as int64 [B, K, T]; `codec` names the training set's codec; bad input is one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from adapter_trainer.config import ConfigError
from adapter_trainer.hydra_cli import find_conf_dir
from adapter_trainer.model.adapter_io import AdapterError
from tests.contract.shard_fixture import write_synthetic_set
from tests.trainer.helpers import tiny_demo_overrides

pytestmark = pytest.mark.usefixtures("one_thread", "reused_tokenizers")
CAPTIONS = ["a calm solo piano ballad with soft reverb", "loud distorted electric guitar rock with fast drums", ""]


def compose(config: str, args: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        return hydra_compose(config, overrides=args)


def export_tiny_adapter(models: dict[str, Path], work: Path, out: Path, *extra: str) -> Path:
    """A tiny real EnCodec, a synthetic shard set whose manifest names it (sha256, identity config, path from the set),
    a 2-step demo-preset run on the tiny demo models, exported to `out` (`extra`: more training overrides)."""
    from transformers import EncodecConfig

    from adapter_trainer.config import to_train_config
    from adapter_trainer.sharing.export import export_adapter
    from adapter_trainer.training.recipe import recipe_main
    from tests.pipeline.helpers import make_tiny_codec
    from tokenizer_pipeline.codec.encode import config_identity

    codec = make_tiny_codec(work / "codec", seed=0, codebook_size=2048)
    root = write_synthetic_set(work / "set", n_train=12, n_eval=4, frames=(12, 24))
    manifest = json.loads((root / "manifest.json").read_text())
    weights = b"".join(p.read_bytes() for p in sorted(codec.glob("*.safetensors")))
    manifest["codec"].update(
        name_or_path=str(codec),
        weights_sha256=hashlib.sha256(weights).hexdigest(),
        path_from_set=Path(os.path.relpath(codec, root)).as_posix(),
        config=config_identity(EncodecConfig.from_pretrained(codec)),
    )
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    run = work / "run"
    args = tiny_demo_overrides(models, root, run, "trainer.eval_bootstrap=50", "optimizer.warmup_steps=1")
    recipe_main(to_train_config(compose("config", [*args, "data.caption_dropout=0.5", "trainer.max_steps=2", *extra])))
    return export_adapter(run, out)


@pytest.fixture(scope="module")
def exported(models, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("api")
    return export_tiny_adapter(models, work, work / "calm-adapter")


@pytest.fixture(scope="module")
def adapter(exported: Path):
    from adapter_trainer import MoTAdapter

    return MoTAdapter.from_pretrained(exported, device="cpu")


def test_generate_gives_the_codes_the_generate_command_writes(exported: Path, adapter, tmp_path: Path) -> None:
    from adapter_trainer.data.samples import load_split
    from adapter_trainer.data.shards import read_manifest
    from adapter_trainer.generation.generate import run_generate, to_generate_config

    settings = {"seconds": 0.3, "cfg_scale": 3.0, "top_k": 50, "temperature": 1.0, "seed": 7}
    args = [f"generate.adapter={exported}", "generate.captions=texts", f"generate.texts={json.dumps(CAPTIONS)}"]
    args += [f"generate.{k}={v}" for k, v in settings.items()] + ["generate.batch_size=2", "trainer.device=cpu"]
    run_generate(to_generate_config(compose("generate", [*args, f"generate.out_dir={tmp_path / 'cli'}"])))
    written = load_split([read_manifest(tmp_path / "cli")], "generated")  # the command's clips, in caption order

    codes = adapter.generate(CAPTIONS, batch_size=3, **settings)  # another batching: a clip's codes do not depend on it
    K, T = adapter.source.vocab.n_codebooks, round(0.3 * adapter.frame_rate)
    assert codes.dtype == torch.int64 and tuple(codes.shape) == (3, K, T)
    assert [c.caption for c in written] == CAPTIONS
    for row, clip in zip(codes, written):  # clip.codes: [T_b, K]
        n = clip.codes.shape[0]
        assert torch.equal(row[:, :n], torch.from_numpy(clip.codes.astype(np.int64)).T)
        assert bool((row[:, n:] == -1).all())  # after an AUDIO_END: the pad code
    assert torch.equal(adapter.generate(CAPTIONS, batch_size=3, **settings), codes)  # a rerun: the same codes
    other = adapter.generate(CAPTIONS, batch_size=3, **{**settings, "seed": 8})
    assert not torch.equal(other, codes)  # the comparison above can fail: another seed, other codes


def test_generate_takes_its_defaults_from_generation_config(exported: Path, tmp_path: Path) -> None:
    from adapter_trainer import MoTAdapter

    folder = shutil.copytree(exported, tmp_path / "a")
    gen = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**gen, "seconds": 0.1, "top_k": 7}))
    adapter = MoTAdapter.from_pretrained(folder, device="cpu")
    assert adapter.generation_config["seconds"] == 0.1 and adapter.generation_config["top_k"] == 7
    assert adapter.generate("calm piano").shape[-1] == round(0.1 * adapter.frame_rate)  # one caption: B = 1
    assert adapter.generate(["calm piano"], seconds=0.2).shape == (1, 4, round(0.2 * adapter.frame_rate))


def test_the_adapter_names_the_codec_of_its_training_set(exported: Path, adapter) -> None:
    acfg = json.loads((exported / "adapter_config.json").read_text())
    recorded = acfg["codec"]  # the training set's manifest codec block, path_from_set re-based to the folder
    assert {"name_or_path", "path_from_set", "weights_sha256", "config", "sampling_rate"} <= set(recorded)
    codec = adapter.codec
    assert Path(codec["path"]) == (exported / recorded["path_from_set"]).resolve() and Path(codec["path"]).is_dir()
    for key in ("name_or_path", "weights_sha256", "n_codebooks", "codebook_size", "sampling_rate", "config"):
        assert codec[key] == recorded[key], key
    assert adapter.frame_rate == recorded["frame_rate"] and json.loads(json.dumps(codec)) == codec  # plain values
    moved = {**acfg, "codec": {**recorded, "path_from_set": "../nowhere"}}  # a folder moved away from its codec
    adapter.loaded.adapter_config = moved
    try:
        assert "path" not in adapter.codec and adapter.codec["name_or_path"] == recorded["name_or_path"]
    finally:
        adapter.loaded.adapter_config = acfg


def test_base_towers_can_be_given_by_keyword(models, exported: Path, adapter, tmp_path: Path) -> None:
    from adapter_trainer import MoTAdapter

    llm = shutil.copytree(models["llm"], tmp_path / "my-llm")
    again = MoTAdapter.from_pretrained(exported, llm=llm, device="cpu")
    assert again.loaded.config.model.llm == str(llm)
    assert torch.equal(again.generate(CAPTIONS[:1], seconds=0.1), adapter.generate(CAPTIONS[:1], seconds=0.1))
    with pytest.raises(AdapterError, match="audio_lm") as e:
        MoTAdapter.from_pretrained(exported, audio_lm=models["llm"], device="cpu")  # not the tower it trained on
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"texts": []}, r"MoTAdapter.generate: texts=\[\]: pass one caption or more"),
        ({"texts": [3]}, "as strings"),
        ({"texts": ["x"], "seconds": 0}, r"MoTAdapter.generate: seconds=0 must be > 0"),
        ({"texts": ["x"], "seconds": float("nan")}, "seconds=nan must be a finite number"),
        ({"texts": ["x"], "top_k": -1}, "top_k=-1 must be >= 0"),
        ({"texts": ["x"], "batch_size": 0}, "batch_size=0 must be >= 1"),
    ],
)
def test_bad_generate_settings_are_one_line(adapter, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        adapter.generate(**kwargs)
    assert "\n" not in str(e.value) and "generate." not in str(e.value).split(": ", 1)[1]


def test_guidance_needs_a_trained_empty_caption(exported: Path, adapter) -> None:
    acfg = adapter.loaded.adapter_config
    adapter.loaded.adapter_config = {**acfg, "captions": {**acfg["captions"], "caption_dropout": 0.0}}
    try:
        with pytest.raises(ConfigError, match=r"cfg_scale=3.0 needs the empty caption.*allow_untrained_uncond=True"):
            adapter.generate(["x"], seconds=0.1, cfg_scale=3.0)
        assert adapter.generate(["x"], seconds=0.1, cfg_scale=1.0).shape[0] == 1
    finally:
        adapter.loaded.adapter_config = acfg


def test_a_missing_or_foreign_folder_is_one_line(tmp_path: Path, monkeypatch) -> None:
    from adapter_trainer import MoTAdapter

    monkeypatch.chdir(tmp_path)
    (tmp_path / "build").mkdir()  # `build/x` names a missing folder only where `build` is a folder here
    cases = [
        (tmp_path / "nope", "adapter folder .*nope does not exist; export one with"),
        ("build/no-such-adapter", "does not exist"),  # a relative path, not a Hub id
        (tmp_path, "adapter_config.json not found"),  # a directory, but no adapter in it
        ("nobuild/no-such-adapter", "no such folder, and the Hub repo is unreadable"),  # could be a Hub id
    ]
    for name, message in cases:
        with pytest.raises(AdapterError, match=message) as e:
            MoTAdapter.from_pretrained(name, device="cpu")
        assert "\n" not in str(e.value)


def test_a_hub_id_loads_the_snapshot_the_hub_gives(exported: Path, monkeypatch) -> None:
    import huggingface_hub

    from adapter_trainer.generation.model_source import adapter_folder
    from adapter_trainer.model import hub_source

    asked = []
    monkeypatch.setattr(hub_source, "cache_only", lambda repo: asked.append(repo) or False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo, **kw: asked.append(kw) or str(exported))
    assert adapter_folder("me/calm-adapter", revision="main") == exported
    assert asked == ["me/calm-adapter", {"revision": "main", "local_files_only": False}]

    def refuse(repo, **kw):
        raise OSError("401 Client Error: Unauthorized\nfor url ...")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    with pytest.raises(AdapterError, match="'me/private': no such folder, and the Hub repo is unreadable") as e:
        adapter_folder("me/private")
    assert "\n" not in str(e.value) and "401" in str(e.value)

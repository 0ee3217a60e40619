"""`demo_models --part text` then `--part music` (make demo's two jobs) write the same weights as one `--part all`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from adapter_trainer.demo.models import TEXT_ENCODER_DIR, write_demo_models
from adapter_trainer.demo.music_pretrain import MusicPretrainConfig
from adapter_trainer.demo.pretrain import PretrainConfig
from adapter_trainer.demo.t5_pretrain import T5PretrainConfig
from tests.contract.shard_fixture import write_synthetic_set


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("parts")
    csv = root / "captions.csv"
    rows = [f"y{i:03d},a {['calm', 'loud', 'slow', 'fast'][i % 4]} {['piano', 'drum', 'flute'][i % 3]} song {i}"
            for i in range(40)]  # fmt: skip
    csv.write_text("ytid,caption\n" + "\n".join(rows) + "\n")
    shards = write_synthetic_set(root / "set", n_train=6, n_eval=2, frames=(12, 20))
    return {
        "captions_csv": csv,
        "shards": shards,
        "pretrain": PretrainConfig(steps=2, batch_size=4),
        "t5_pretrain": T5PretrainConfig(steps=2, batch_size=4),
        "music_pretrain": MusicPretrainConfig(steps=2, batch_size=2, max_frames=16, warmup_steps=1),
    }


def test_text_then_music_equals_all(inputs: dict, tmp_path: Path) -> None:
    one = write_demo_models(tmp_path / "all", **inputs)
    write_demo_models(tmp_path / "two", parts=("text",), **inputs)
    assert (tmp_path / "two" / TEXT_ENCODER_DIR / "model.safetensors").is_file()
    assert not (tmp_path / "two" / "musicgen" / "model.safetensors").exists()
    two = write_demo_models(tmp_path / "two", parts=("music",), **inputs)
    for name in ("llm", "musicgen"):
        a, b = load_file(one[name] / "model.safetensors"), load_file(two[name] / "model.safetensors")
        assert a.keys() == b.keys()
        assert all((a[k] == b[k]).all() for k in a), name
    record = json.loads((two["musicgen"] / "demo_pretraining.json").read_text())["text_encoder"]
    assert record["pretraining"]["config"]["steps"] == 2


def test_music_alone_needs_the_text_part_first(inputs: dict, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--part text"):
        write_demo_models(tmp_path / "m", parts=("music",), **inputs)


def test_a_text_encoder_of_other_settings_is_pretrained_again(inputs: dict, tmp_path: Path) -> None:
    write_demo_models(tmp_path / "m", parts=("text",), **inputs)
    other = {**inputs, "t5_pretrain": T5PretrainConfig(steps=3, batch_size=4)}
    out = write_demo_models(tmp_path / "m", parts=("music",), **other)
    record = json.loads((out["musicgen"] / "demo_pretraining.json").read_text())["text_encoder"]
    assert record["pretraining"]["config"]["steps"] == 3

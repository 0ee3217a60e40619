"""training.data_setup's refusals of the data itself, before any weight is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from adapter_trainer.config import ConfigError, to_train_config
from adapter_trainer.data.shards import open_shard_sets
from adapter_trainer.hydra_cli import find_conf_dir
from adapter_trainer.training.data_setup import split_indexes
from tests.contract.shard_fixture import synthetic_clips, write_shard_set


def test_an_empty_train_split_points_at_the_set_s_failures(tmp_path: Path) -> None:
    # what stage 1 leaves after a wrong audio_dir: no sample, every row a line of failures.jsonl
    root = write_shard_set(tmp_path / "set", {"train": [], "eval": synthetic_clips(2, seed=1)})
    (root / "failures.jsonl").write_text("".join(json.dumps({"ytid": f"y{i}"}) + "\n" for i in range(23)))
    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        cfg = to_train_config(compose("config", overrides=["+experiment=demo", f"data.shards=[{root}]"]))
    sets = open_shard_sets([str(root)], model_n_codebooks=4, model_codebook_size=2048)
    with pytest.raises(ConfigError) as e:
        split_indexes(cfg.data, sets)
    msg = str(e.value)
    assert "\n" not in msg and "data.train_split='train'" in msg
    assert f"{root / 'failures.jsonl'} lists 23 failed rows" in msg and "python -m tokenizer_pipeline.verify" in msg

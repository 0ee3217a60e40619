"""data.shards entries: plain paths (concatenation, as before) or {path: DIR, weight: W} (a weighted mixture), in
YAML and on the Hydra command line; a bad entry is one ConfigError naming the entry and the fix."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from adapter_trainer.config import ConfigError, ShardSource, shard_paths, shard_sources, shard_weights, to_train_config
from adapter_trainer.hydra_cli import find_conf_dir


def _typed(*overrides: str):
    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        return to_train_config(compose("config", overrides=["+experiment=demo", *overrides]))


def test_the_hydra_command_line_form_gives_weights() -> None:
    cfg = _typed("data.shards=[{path: a, weight: 3}, {path: b, weight: 1}]")
    assert shard_sources(cfg.data.shards) == [ShardSource("a", 3.0), ShardSource("b", 1.0)]
    assert shard_paths(cfg.data.shards) == ["a", "b"] and shard_weights(cfg.data.shards) == [3.0, 1.0]


def test_plain_paths_stay_a_concatenation_and_weigh_one_in_a_mixture() -> None:
    plain = _typed("data.shards=[a, b]")
    assert (
        plain.data.shards == ["a", "b"]
        and shard_paths(plain.data.shards) == ["a", "b"]
        and shard_weights(plain.data.shards) is None
    )
    no_weights = _typed("data.shards=[{path: a}, b]")
    assert shard_weights(no_weights.data.shards) is None  # no weight anywhere: concatenation
    mixed = _typed("data.shards=[{path: a, weight: 2.5}, b]", "data.mixture_epoch_size=100")
    assert shard_weights(mixed.data.shards) == [2.5, 1.0] and mixed.data.mixture_epoch_size == 100


@pytest.mark.parametrize(
    "shards, must_say",
    [
        ("[{path: a, weight: 0}]", r"data.shards\[0\]=.*weight must be a finite number > 0, got 0"),
        ("[b, {path: a, weight: -2}]", r"data.shards\[1\]=.*weight must be a finite number > 0, got -2"),
        ("[{path: a, weight: heavy}]", r"weight must be a finite number > 0, got 'heavy'"),
        ("[{weight: 2}]", r"data.shards\[0\]=\{'weight': 2\} has no path"),
        ("[{path: a, wieght: 2}]", r"unknown key\(s\) \['wieght'\] \(allowed: path, weight\)"),
        ("[a, b, ./a]", r"data.shards\[2\]='./a' is the same shard set as data.shards\[0\]"),
    ],
)
def test_bad_entries_are_refused_naming_the_entry_and_the_fix(shards: str, must_say: str) -> None:
    with pytest.raises(ConfigError, match=must_say) as e:
        _typed(f"data.shards={shards}")
    assert "\n" not in str(e.value)
    assert "{path: DIR, weight: W}" in str(e.value) or "list each set once" in str(e.value)


def test_an_epoch_size_without_weights_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"data.mixture_epoch_size=10 needs weighted data.shards"):
        _typed("data.shards=[a, b]", "data.mixture_epoch_size=10")

"""Stage 2's advice on an eval split too short for the caption-gain check fits the setting that made it short."""

from __future__ import annotations

import numpy as np
import pytest


def test_the_trainers_advice_for_a_short_eval_split_fits_the_setting() -> None:
    from adapter_trainer.config import ConfigError, DataConfig
    from adapter_trainer.training.eval_setup import check_splits

    class Index:
        def __init__(self, keys: list[str]) -> None:
            self.keys, self.caption_digest = keys, np.arange(len(keys))

        def __len__(self) -> int:
            return len(self.keys)

        def key(self, i: int) -> str:
            return self.keys[i]

    for cap, says in ((0, "encode more clips into that split"), (1, "raise data.eval_max_clips=1")):
        with pytest.raises(ConfigError) as e:
            check_splits(DataConfig(shards=["s"], eval_max_clips=cap), Index(["a", "b"]), Index(["c"]))
        assert says in str(e.value) and "eval_max_clips=0)" not in str(e.value)

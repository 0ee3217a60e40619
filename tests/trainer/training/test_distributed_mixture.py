"""torchrun with 2 CPU ranks (gloo, 2 workers each) on a weighted mixture of two shard sets: the ranks see exactly
the examples of one process across mixture epochs, and the per-set held-out figures match it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.contract.shard_fixture import synthetic_clips, write_shard_set, write_synthetic_set
from tests.trainer.helpers import run_recipe_recording_keys
from tests.trainer.training.test_distributed import compose, overrides, run_two_ranks

GLOBAL_BATCH = 4


@pytest.mark.multiprocess
@pytest.mark.budget(90, reason="a one-process run and a 2-rank torchrun run of the musicgen tower")
def test_two_ranks_see_the_one_process_mixture(models, tmp_path: Path) -> None:
    a = write_synthetic_set(tmp_path / "a", n_train=12, n_eval=4, frames=(12, 30), samples_per_shard=32)
    b = write_shard_set(
        tmp_path / "b",
        {"train": synthetic_clips(3, seed=5, prefix="bb"), "eval": synthetic_clips(3, seed=6, prefix="be")},
    )
    mix = (f"data.shards=[{{path: {a}, weight: 3}}, {{path: {b}, weight: 1}}]", "data.mixture_epoch_size=6")
    ref, ref_keys = run_recipe_recording_keys(
        compose(overrides(models, a, tmp_path / "one", GLOBAL_BATCH, "trainer.num_workers=0", *mix))
    )
    out = tmp_path / "two"
    run_two_ranks(overrides(models, a, out, GLOBAL_BATCH // 2, "trainer.num_workers=2", *mix), out)
    r0 = json.loads((out / "dump.json").read_text())
    r1 = json.loads((out / "dump.json.rank1").read_text())
    assert [x + y for x, y in zip(r0["keys_seen"], r1["keys_seen"])] == ref_keys
    assert ref["progress"]["epoch"] >= 2  # 16 examples crossed mixture epochs of 6
    assert any(k.startswith("bb") for k in sum(ref_keys, []))  # the small set was drawn
    got = json.loads((out / "final_metrics.json").read_text())["learning_check"]["per_shard_set"]
    want = ref["learning_check"]["per_shard_set"]
    assert list(got) == list(want) == [str(a), str(b)]
    for name in want:
        assert got[name]["n_clips"] == want[name]["n_clips"]
        assert got[name]["ce"] == pytest.approx(want[name]["ce"], rel=1e-4), name

"""The learning check per shard set: each set's held-out CE is the CE the same model gets on that set alone, and
it reaches final_metrics.json's learning_check block and the printed report next to the overall figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from adapter_trainer.data.mixture import split_spans
from adapter_trainer.data.shards import open_shard_sets
from adapter_trainer.data.split_index import build_index
from adapter_trainer.data.streaming import ExampleSpec
from adapter_trainer.evaluation.held_out import EvalRun, HeldOutEval
from adapter_trainer.evaluation.learning_check import learning_check_summary, learning_check_text
from tests.contract.shard_fixture import synthetic_clips, write_shard_set, write_synthetic_set
from tests.trainer.data.test_streaming import _WordTokenizer
from tests.trainer.helpers import tiny_mot

pytestmark = pytest.mark.usefixtures("one_thread")
# relative: the same clips scored in other batches (other padding), and the per-clip vs per-codebook float32 sums of
# the same targets, differ by float rounding only
CE_TOL = 1e-5


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("per_set")
    a = write_synthetic_set(root / "a", n_train=4, n_eval=5, frames=(12, 20))
    b = write_shard_set(
        root / "b",
        {"train": synthetic_clips(3, seed=5, prefix="bb"), "eval": synthetic_clips(3, seed=6, prefix="be")},
    )
    return [a, b]


def _report(model, vocab, roots: list[Path], names: list[str]):
    sets = open_shard_sets([str(r) for r in roots], model_n_codebooks=4, model_codebook_size=2048)
    index = build_index(sets, "eval")
    spec = ExampleSpec(
        vocab=vocab, pattern="delay", text="caption", bos_id=1, pad_id=2, max_seq_len=40, max_caption_tokens=6
    )
    uniform = np.full((4, 2048), -np.log(2048.0))  # [K, C]
    spans = [(n, a, b) for n, (a, b) in zip(names, split_spans(sets, "eval", len(index)))]
    held_out = HeldOutEval(index, _WordTokenizer(), spec, uniform, n_derangements=1, seed=0, set_spans=spans)
    return held_out(model, EvalRun(batch_size=4, device=torch.device("cpu")), step=0, n_bootstrap=50, seed=0)


def test_each_sets_ce_is_its_ce_alone_with_the_same_model(two_sets) -> None:
    model, vocab = tiny_mot()
    both = _report(model, vocab, two_sets, ["a", "b"])
    assert list(both.per_shard_set) == ["a", "b"]
    for name, root in zip(("a", "b"), two_sets):
        alone = _report(model, vocab, [root], [name])
        got = both.per_shard_set[name]
        assert got["ce"] == pytest.approx(alone.ce, rel=CE_TOL)
        assert got["unigram_ce"] == pytest.approx(alone.unigram_ce, rel=CE_TOL)
        assert got["n_clips"] == alone.n_clips and got["n_code_targets"] == alone.n_code_targets
        assert alone.per_shard_set[name]["ce"] == pytest.approx(alone.ce, rel=CE_TOL)  # one set: the overall CE
    assert both.per_shard_set["a"]["n_clips"] + both.per_shard_set["b"]["n_clips"] == both.n_clips == 8
    # the overall CE is the target-weighted mean of the sets' CEs
    parts = both.per_shard_set.values()
    assert both.ce == pytest.approx(sum(p["ce"] * p["n_code_targets"] for p in parts) / both.n_code_targets, rel=CE_TOL)
    summary = learning_check_summary(both)
    assert summary["per_shard_set"] == both.per_shard_set and "eval_ce" in summary and "caption_gain" in summary
    text = learning_check_text(both)
    assert f"set a: CE {both.per_shard_set['a']['ce']:.4f}" in text and "set b: CE" in text
    assert "set a" not in learning_check_text(_report(model, vocab, [two_sets[0]], ["a"]))  # one set: no extra lines

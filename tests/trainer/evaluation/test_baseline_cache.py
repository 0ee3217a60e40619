"""The frozen baselines kept in the run directory (evaluation/baseline_cache.py): a resumed run reads MusicGen's and
the teacher's figures instead of loading and scoring them again, and gets the same learning check; any setting they
depend on is another key (scored again); an older set's baselines are not kept."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from adapter_trainer.evaluation import baseline_cache
from tests.contract.shard_fixture import write_synthetic_set
from tests.trainer.helpers import make_cfg

pytestmark = pytest.mark.usefixtures("one_thread", "reused_tokenizers")
TEACHER = ("music_lm_ce", "music_lm_text_ce", "music_lm_text_ce_shuffled", "teacher_caption_gain")


@pytest.fixture(scope="module")
def indexed_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("v5") / "set"
    return write_synthetic_set(root, n_train=12, n_eval=4, frames=(12, 24))


def _run(models, shards: Path, out: Path, *overrides: str) -> dict:
    from adapter_trainer.training.recipe import recipe_main

    return recipe_main(make_cfg(models, shards, out, "trainer.eval_teacher=true", *overrides))


def _loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every load of MusicGen alone or of the teacher from here on, by name."""
    from adapter_trainer.model import builders, teacher

    calls: list[str] = []
    for module, name in ((builders, "load_musicgen_decoder"), (teacher, "load_musicgen_teacher")):
        original = getattr(module, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.budget(60, reason="four short trainings with their learning checks")
def test_a_resumed_run_reads_its_baselines_and_reports_the_same(
    models, indexed_set: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    first = _run(models, indexed_set, out, "trainer.max_steps=2")
    kept = list((out / "baselines").glob("*.npz"))
    assert len(kept) == 1 and first["eval"]["teacher_status"].startswith("MusicGen with its own text encoder")

    calls = _loads(monkeypatch)
    resumed = _run(models, indexed_set, out, "trainer.max_steps=3", "trainer.resume=latest")
    assert "load_musicgen_teacher" not in calls and calls.count("load_musicgen_decoder") <= 1  # the MoT's own load
    for k in TEACHER:
        assert resumed["eval"][k] == first["eval"][k], k
    assert resumed["eval"]["teacher_status"] == first["eval"]["teacher_status"]

    # another derangement count changes the teacher's shuffled figure: another key, scored again, kept beside
    calls.clear()
    _run(models, indexed_set, tmp_path / "other", "trainer.max_steps=1", "trainer.eval_caption_shuffles=2")
    assert "load_musicgen_teacher" in calls


def test_a_kept_file_round_trips_and_a_broken_one_is_scored_again(models, indexed_set: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    _run(models, indexed_set, out, "trainer.max_steps=1")
    (path,) = (out / "baselines").glob("*.npz")
    got = baseline_cache.load_baselines(path)
    assert got is not None and got["teacher_true"] is not None and got["music_lm"].sum_per_frame is not None
    with np.load(path) as z:  # the file names what its key was made of
        identity = json.loads(str(z["identity"]))
    assert baseline_cache.baseline_key(**identity) == path.stem
    # the codes scored: a set encoded again (other codes under the same keys and captions) is another key
    manifest = hashlib.sha256((indexed_set / "manifest.json").read_bytes()).hexdigest()
    assert identity["shard_manifests_sha256"] == [manifest]
    path.write_bytes(path.read_bytes()[:100])  # truncated
    assert baseline_cache.load_baselines(path) is None

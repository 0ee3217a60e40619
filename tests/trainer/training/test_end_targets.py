"""The learning check's END CE line says how often AUDIO_END was a training target: counted per training window
over the whole run, equal to an independent count over the same batches, kept across a resume (and said to be
partial when the checkpoint did not count), and written to final_metrics.json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adapter_trainer.evaluation.learning_check import learning_check_text
from adapter_trainer.evaluation.report import make_report
from adapter_trainer.evaluation.target_ce import TargetCE
from adapter_trainer.training.distributed import teardown_distributed
from adapter_trainer.training.recipe import MoTAdapterRecipe, recipe_main
from tests.contract.shard_fixture import synthetic_clips, write_shard_set
from tests.trainer.helpers import make_cfg

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Train clips of 12-60 frames around the ~31-frame training sequence (48 tokens, delay pattern): the short ones
    always end inside a sequence, the long ones only when the random crop lands on their end."""
    return write_shard_set(
        tmp_path_factory.mktemp("shards") / "set",
        {
            "train": synthetic_clips(12, frames=(12, 60), seed=0, prefix="tr"),
            "eval": synthetic_clips(4, frames=(12, 20), seed=1, prefix="ev"),
        },
    )


def _run_recording_end_windows(cfg) -> tuple[MoTAdapterRecipe, dict, int, int]:
    """A run with every micro-batch's sequences counted from the tokens (AUDIO_END written into slot 0 of a
    position: token_layout's convention), independently of the labels the recipe counts from.
    Returns (recipe, final metrics, sequences seen, sequences whose tokens hold AUDIO_END)."""
    recipe = MoTAdapterRecipe(cfg)
    try:
        recipe.setup()
        fetch, counts = recipe.next_train_batch, {"windows": 0, "end": 0}

        def next_train_batch(batches):
            batch = fetch(batches)
            has_end = (batch.tokens[..., 0] == recipe.vocab.audio_end).any(dim=1)  # [B]
            counts["windows"] += int(has_end.shape[0])
            counts["end"] += int(has_end.sum())
            return batch

        recipe.next_train_batch = next_train_batch
        recipe.train()
        return recipe, recipe.cleanup(), counts["windows"], counts["end"]
    finally:
        teardown_distributed()


def test_end_targets_are_counted_per_training_sequence(models, shards, tmp_path: Path, capsys) -> None:
    cfg = make_cfg(models, shards, tmp_path / "run", "trainer.max_steps=6", "trainer.grad_accum_steps=2")
    recipe, final, windows, end_windows = _run_recording_end_windows(cfg)
    assert windows == 6 * 2 * 2  # steps x micro-batches x batch size
    assert 0 < end_windows < windows  # short clips always end in the window, long ones mostly not
    p = recipe.progress
    assert (p.train_sequences, p.train_end_targets) == (windows, end_windows)
    lc = final["learning_check"]
    assert (lc["train_sequences"], lc["train_end_targets"]) == (windows, end_windows)
    assert lc["n_train_clips"] == 12
    end_line = next(line for line in capsys.readouterr().out.split("\n") if "END CE" in line)
    assert end_line.endswith(f"(AUDIO_END was a training target in {end_windows} of {windows} sequences)")
    saved = json.loads((tmp_path / "run/checkpoints/step-000006/progress.json").read_text())
    assert (saved["train_sequences"], saved["train_end_targets"]) == (windows, end_windows)


@pytest.mark.parametrize(
    "frames,crop,expect",
    [((12, 20), "data.start_crop_prob=0.0", "all"), ((70, 90), "data.start_crop_prob=1.0", "none")],
    ids=["clips_shorter_than_the_window", "windows_never_reach_a_clip_end"],
)
def test_end_count_is_all_or_none_when_every_window_does_or_never_reaches_an_end(
    models, tmp_path: Path, frames: tuple[int, int], crop: str, expect: str
) -> None:
    data = write_shard_set(
        tmp_path / "set",
        {
            "train": synthetic_clips(6, frames=frames, seed=2, prefix="tr"),
            "eval": synthetic_clips(3, frames=(12, 20), seed=3, prefix="ev"),
        },
    )
    cfg = make_cfg(models, data, tmp_path / "run", "trainer.max_steps=3", crop)
    recipe, final, windows, end_windows = _run_recording_end_windows(cfg)
    assert recipe.progress.train_sequences == windows == 3 * 2
    assert recipe.progress.train_end_targets == end_windows == (windows if expect == "all" else 0)


def test_a_checkpoint_of_another_layout_is_refused_in_one_line_naming_the_retrain(
    models, shards, tmp_path: Path
) -> None:
    """A checkpoint whose progress.json lacks this layout's fields: one ResumeError line that says to retrain."""
    from adapter_trainer.training.checkpoint import ResumeError

    common = ("trainer.ckpt_every=2",)
    recipe_main(make_cfg(models, shards, tmp_path / "run", "trainer.max_steps=2", *common))
    progress = tmp_path / "run/checkpoints/step-000002/progress.json"
    old = {k: v for k, v in json.loads(progress.read_text()).items() if k in ("step", "epoch", "index", "tokens_seen")}
    progress.write_text(json.dumps(old))
    with pytest.raises(ResumeError) as e:
        recipe_main(make_cfg(models, shards, tmp_path / "run", "trainer.max_steps=4", "trainer.resume=latest", *common))
    msg = str(e.value)
    assert "\n" not in msg and "progress.json" in msg and "retrain" in msg and "step-000002" in msg


def test_end_line_without_training_counts_stays_as_before() -> None:
    """A report built outside a run (no training counts): the END CE line adds nothing about training."""
    n = np.full(4, 10)
    s = np.arange(4, dtype=np.float64) * 10
    ce = TargetCE(np.array([s.sum()]), np.array([n.sum()]), s, n)
    r = make_report(
        step=1, model_true=ce, model_shuf=ce, unigram=ce, end_ce_sum=3.0, end_count=2, n_bootstrap=50, seed=0
    )
    end_line = next(line for line in learning_check_text(r).split("\n") if "END CE" in line)
    assert end_line.rstrip().endswith("1.5000") and "training" not in end_line

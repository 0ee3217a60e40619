"""Stage 1 reads only the CSV columns encoding needs, names a header problem as one, and says when a split it wrote
is too small to train on, handing out no training command that cannot run (stage 2's advice on a short eval split:
tests/trainer/training/test_eval_split_advice.py)."""

from __future__ import annotations

import csv
import json
import tarfile
from pathlib import Path

import pytest

from tests.pipeline.helpers import make_corpus, pipeline_config
from tokenizer_pipeline.errors import PipelineError
from tokenizer_pipeline.run.pipeline import run_pipeline
from tokenizer_pipeline.sources.musiccaps import ABSENT_VALUES

ENCODING = ["ytid", "start_s", "end_s", "caption", "is_audioset_eval"]


def _keep_columns(src: Path, dst: Path, columns: list[str]) -> Path:
    with src.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    with dst.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows({c: r[c] for c in columns} for r in rows)
    return dst


def _sample_json(out: Path) -> dict:
    tar = sorted((out / "train").glob("shard-*.tar"))[0]
    with tarfile.open(tar) as t:
        member = next(m for m in t.getmembers() if m.name.endswith(".json"))
        return json.loads(t.extractfile(member).read())


def test_a_csv_with_only_the_encoding_columns_encodes_and_the_others_get_generated_shards_values(
    corpus, tiny_codec: Path, tmp_path: Path
) -> None:
    csv_path, audio_dir, rows = corpus
    lean = _keep_columns(csv_path, tmp_path / "lean.csv", ENCODING)
    full = run_pipeline(pipeline_config(csv_path, audio_dir, tmp_path / "full", tiny_codec), progress=False)
    result = run_pipeline(pipeline_config(lean, audio_dir, tmp_path / "lean", tiny_codec), progress=False)
    assert result.exit_code == 0, result.message
    assert result.manifest.totals["encoded"] == full.manifest.totals["encoded"] == len(rows)
    sample = _sample_json(tmp_path / "lean")
    assert sample["caption"] == _sample_json(tmp_path / "full")["caption"]
    assert (sample["aspect_list"], sample["audioset_positive_labels"], sample["author_id"]) == ([], [], -1)
    assert sample["is_balanced_subset"] is (ABSENT_VALUES["is_balanced_subset"] == "True")


def test_a_header_without_an_encoding_column_is_named_as_a_header_problem(
    corpus, tiny_codec: Path, tmp_path: Path
) -> None:
    csv_path, audio_dir, _ = corpus
    bad = _keep_columns(csv_path, tmp_path / "bad.csv", ["ytid", "start_s", "end_s", "is_audioset_eval"])
    with pytest.raises(PipelineError) as e:
        run_pipeline(pipeline_config(bad, audio_dir, tmp_path / "out", tiny_codec), progress=False)
    message = str(e.value)
    assert "its header (line 1) lacks the column(s) ['caption']" in message
    assert "row" not in message.split("carried when present")[1]  # no "fix or delete that row" for a header
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize(("n_train", "n_eval", "short"), [(3, 1, ["eval"]), (0, 3, ["train"]), (2, 0, ["eval"])])
def test_a_split_too_small_to_train_on_is_a_warning_and_no_training_command_is_printed(
    tiny_codec: Path, tmp_path: Path, n_train: int, n_eval: int, short: list[str]
) -> None:
    csv_path, audio_dir, _ = make_corpus(tmp_path / "corpus", n_train=n_train, n_eval=n_eval)
    result = run_pipeline(pipeline_config(csv_path, audio_dir, tmp_path / "out", tiny_codec), progress=False)
    lines = result.message.splitlines()
    assert [line.split("'")[1] for line in lines if line.startswith("warning: split")] == short
    assert not any("adapter_trainer" in line for line in lines), result.message
    assert lines[-1].startswith("next: python -m tokenizer_pipeline.verify")


def test_a_set_with_both_splits_gets_the_training_command(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    result = run_pipeline(pipeline_config(csv_path, audio_dir, tmp_path / "out", tiny_codec), progress=False)
    assert "warning" not in result.message and "python -m adapter_trainer +experiment=cuda_1b" in result.message

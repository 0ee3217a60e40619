"""Stage 2 checks what is cheapest and likeliest wrong first: a data.shards entry that is not there is named before
any model is looked at (the models named here do not exist either)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.helpers import run_module_in_process


def test_missing_shards_are_named_before_missing_models(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    args = ["+experiment=demo", f"data.shards=[{tmp_path / 'nope'}]", f"model.llm={tmp_path / 'no-llm'}",
            f"model.audio_lm={tmp_path / 'no-musicgen'}", f"trainer.output_dir={tmp_path / 'run'}"]  # fmt: skip
    code = run_module_in_process("adapter_trainer", *args)
    err = capfd.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert f"data.shards entry {tmp_path / 'nope'} does not exist" in err, err
    assert "model.llm" not in err and "model.audio_lm" not in err, err

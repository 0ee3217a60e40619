"""Every trainer command refuses a user's mistake in one line: exit 2, no traceback, the message names the fix.

One case per command runs it in its own process, as a user does: the exit status, the stderr and the absence of a
traceback are the process's own. The other cases run the same `python -m` entry in this process (runpy; its
SystemExit status and the captured stdout/stderr), which saves each case the command's imports. A key that does not
exist (tests/trainer/test_cli_overrides.py) and Hydra's own refusals (a value of the wrong type) are one line too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO
from tests.trainer.helpers import run_module_in_process, tiny_demo_overrides

pytestmark = pytest.mark.usefixtures("reused_tokenizers")


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ADAPTER_TRAINER_CONF_DIR"}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
    )


def _in_process(capfd: pytest.CaptureFixture[str], module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m module *args` run in this process (tests.trainer.helpers.run_module_in_process), as a result."""
    capfd.readouterr()
    code = run_module_in_process(module, *args)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess([module, *args], code, out, err)


def _assert_refused(proc: subprocess.CompletedProcess, must_say: str, code: int = 2) -> None:
    """Exit `code`, no traceback, `must_say` in stderr; for our refusals (2) the error is one line, the last one
    (before it: model-loading progress bars, or argparse's usage)."""
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert must_say in err, err
    if code == 2:
        assert "error: " in err.splitlines()[-1] and must_say in err.splitlines()[-1], err[-3000:]


@pytest.fixture(scope="module")
def run_dir(models, shards, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step demo-preset run with a checkpoint, trained with caption_dropout=0 (the makers' default)."""
    from adapter_trainer.training.recipe import recipe_main
    from tests.trainer.helpers import make_cfg

    out = tmp_path_factory.mktemp("refusals") / "run"
    recipe_main(make_cfg(models, shards, out, "trainer.max_steps=2", "data.caption_dropout=0"))
    return out


def _train_args(models, shards, out: Path, *extra: str) -> list[str]:
    return tiny_demo_overrides(models, shards, out, "trainer.device=cpu", "trainer.max_steps=1", *extra)


def test_train_refusals(models, shards, run_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _assert_refused(
        _run("adapter_trainer", *_train_args(models, shards, tmp_path / "a", "data.eval_split=train")), "overlap"
    )
    in_process = [
        (
            _train_args(models, shards, run_dir, "trainer.resume=latest", "model.mot.audio_tower=llm"),
            "cannot resume",
            2,
        ),
        (_train_args(models, shards, tmp_path / "b", f"model.llm={tmp_path / 'no-llm'}"), "model.llm", 2),
        (_train_args(models, shards, tmp_path / "c", "trainer.batch_size=two"), "trainer.batch_size=two", 2),
    ]
    for args, must_say, code in in_process:
        _assert_refused(_in_process(capfd, "adapter_trainer", *args), must_say, code=code)
    assert not (tmp_path / "b").exists()  # a refused run leaves no run dir of Hydra's files (.hydra/, its log)
    assert (run_dir / "checkpoints").is_dir()  # a refused resume leaves the run it refused to touch


def test_generate_refusals(models, shards, run_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    base = _train_args(models, shards, run_dir, f"generate.out_dir={tmp_path / 'g'}", "generate.n=2")
    _assert_refused(_run("adapter_trainer.generate", *base), "data.caption_dropout=0")  # cfg_scale 3 by default
    in_process = [
        ([*base, "generate.cfg_scale=1", "model.mot.audio_tower=llm"], "cannot", 2),
        ([*base, "generate.cfg_scale=1", f"model.audio_lm={tmp_path / 'none'}"], "model.audio_lm", 2),
        ([*base, "generate.nope=1"], "generate.nope is not a config key", 2),
    ]
    for args, must_say, code in in_process:
        _assert_refused(_in_process(capfd, "adapter_trainer.generate", *args), must_say, code=code)


def test_other_commands_refusals(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    _assert_refused(
        _run("adapter_trainer.probe", "--shards", str(missing), "--generated", str(missing), "--out", str(missing)),
        "missing",
    )
    _assert_refused(_run("adapter_trainer.listen_page", str(missing)), "missing")
    gen = ("--generated", str(missing), "--reference", str(missing), "--captions", str(missing))
    _assert_refused(_run("adapter_trainer.audio_metrics", *gen, "--out", str(tmp_path / "m.json")), "missing")
    _assert_refused(
        _run("adapter_trainer.demo_models", "--out", str(tmp_path / "m"), "--captions-csv", str(missing)), "missing"
    )

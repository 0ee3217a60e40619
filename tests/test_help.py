"""Every command of both packages answers `--help` with exit 0: the console scripts of both pyproject.toml files and
every `python -m <package>.<command>` module. The two Hydra apps show a short header (Launch / Presets / Override /
Resume) instead of Hydra's boilerplate and its dump of every key.

Each command runs in this process (`python -m` as runpy runs it; its SystemExit status, its captured output): a
subprocess per command would pay every command's imports again."""

from __future__ import annotations

import importlib
import logging
import re
import runpy
import sys
from pathlib import Path

import pytest

from tests import REPO

PACKAGES = ("tokenizer_pipeline", "adapter_trainer")


def console_scripts() -> dict[str, str]:
    """name -> "module:function" of [project.scripts] in both packages' pyproject.toml."""
    scripts: dict[str, str] = {}
    for pkg in PACKAGES:  # the table's `name = "module:function"` lines (tomllib is Python >= 3.11 only)
        text = (REPO / "packages" / pkg / "pyproject.toml").read_text(encoding="utf-8")
        table = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
        if table:
            scripts.update(re.findall(r'^([\w-]+)\s*=\s*"([^"]+)"', table.group(1), re.M))
    return scripts


def command_modules() -> list[str]:
    """Every `python -m` entry of both packages: the package itself and each top-level module run as `__main__`."""
    found = []
    for pkg in PACKAGES:
        src = REPO / "packages" / pkg / "src" / pkg
        found.append(pkg)
        found += [
            f"{pkg}.{p.stem}"
            for p in sorted(src.glob("*.py"))
            if p.stem != "__main__" and 'if __name__ == "__main__":' in p.read_text(encoding="utf-8")
        ]
    return found


def _run_module(module: str) -> None:
    """`python -m module` as runpy runs it, afresh: a copy another test imported is set aside meanwhile (runpy warns
    about executing a module that is already imported) and put back after."""
    saved = sys.modules.pop(module, None)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        if saved is not None:
            sys.modules[module] = saved


def _exit_code(run) -> int:
    root = logging.getLogger()
    handlers, level, argv = root.handlers[:], root.level, sys.argv
    try:
        run()
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.argv = argv
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers[:] = handlers
        root.setLevel(level)


def test_both_packages_have_their_console_script_and_commands() -> None:
    assert console_scripts() == {
        "adapter-trainer": "adapter_trainer.__main__:main",
        "tokenizer-pipeline": "tokenizer_pipeline.__main__:main",
    }
    assert {"tokenizer_pipeline.decode", "tokenizer_pipeline.verify", "adapter_trainer.generate"} <= set(
        command_modules()
    )


@pytest.mark.budget(60, reason="imports every command of both packages (transformers, the codec, the model code)")
def test_every_command_answers_help_with_exit_0(tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a command writes lands in the repository
    failed = {}
    for name, target in console_scripts().items():
        module, func = target.split(":")
        sys.argv = [name, "--help"]
        imported = module in sys.modules
        code = _exit_code(lambda m=module, f=func: getattr(importlib.import_module(m), f)())
        if not imported:  # runpy runs a `__main__` module afresh below: no stale copy in sys.modules
            sys.modules.pop(module)
        out, err = capfd.readouterr()
        if code != 0 or not out.strip():
            failed[name] = (code, (out + err)[-300:])
    for module in command_modules():
        sys.argv = [module, "--help"]
        code = _exit_code(lambda m=module: _run_module(m))
        out, err = capfd.readouterr()
        if code != 0 or not out.strip():
            failed[module] = (code, (out + err)[-300:])
    assert not failed, failed
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("module", PACKAGES)
def test_the_hydra_apps_show_a_short_header(module: str, capfd: pytest.CaptureFixture[str]) -> None:
    sys.argv = [module, "--help"]
    code = _exit_code(lambda: _run_module(module))
    out = capfd.readouterr().out
    assert code == 0 and "powered by Hydra" not in out and "== Config ==" not in out, out[:500]
    assert len(out.splitlines()) <= 30, out
    for heading in ("Launch:", "Presets:", "Override:", "Resume:"):
        assert heading in out, (heading, out)


def test_make_help_lists_real_targets() -> None:
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("no make program here")
    r = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    listed = set(re.findall(r"\bmake (\w[\w-]*)", r.stdout))
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(encoding="utf-8"), re.M))
    assert {"setup", "demo", "shards", "train", "verify", "test", "listen", "generate"} <= listed <= targets

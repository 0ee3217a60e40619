"""A normal (non-editable) install finds its Hydra configs: the wheel carries conf/<package>, and a relative
`config_path` would break here. Each package's wheel is built, installed into a temp dir, and run from a cwd
outside the repository with that dir first on sys.path (ahead of the editable install)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels, site = tmp_path_factory.mktemp("wheels"), tmp_path_factory.mktemp("site")
    for pkg in ("tokenizer_pipeline", "adapter_trainer"):
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO / "packages" / pkg)],
            check=True,
        )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            *map(str, sorted(wheels.glob("*.whl"))),
        ],
        check=True,
    )
    return site


@pytest.mark.parametrize(
    "pkg, args, expect",
    [
        ("adapter_trainer", ["+experiment=demo", "--cfg", "job"], "max_seq_len: 128"),
        ("tokenizer_pipeline", ["audio_dir=/nowhere", "--cfg", "job"], "name_or_path: facebook/encodec_32khz"),
    ],
)
def test_wheel_install_finds_its_configs(
    installed: Path, tmp_path: Path, pkg: str, args: list[str], expect: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_CONF_DIR")}
    env["PYTHONPATH"] = str(installed)
    where = subprocess.run(
        [sys.executable, "-c", f"import {pkg}.hydra_cli as c; print(c.find_conf_dir())"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where) == installed / pkg / "conf"  # the wheel's copy, not the repository's conf/
    out = subprocess.run([sys.executable, "-m", pkg, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert expect in out.stdout

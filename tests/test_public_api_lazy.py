"""Each package's public names load on first use: importing the package pulls in no torch, and its API never
imports the other package."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import REPO


@pytest.mark.parametrize(
    "package, name, module, other",
    [
        ("adapter_trainer", "MoTAdapter", "adapter_trainer.generation.api", "tokenizer_pipeline"),
        ("tokenizer_pipeline", "decode_codes", "tokenizer_pipeline.codec.decode_api", "adapter_trainer"),
    ],
)
def test_the_package_exports_its_api_lazily(package: str, name: str, module: str, other: str) -> None:
    code = (
        f"import sys, {package}\n"
        "light = 'torch' not in sys.modules\n"
        f"from {package} import {name}\n"
        f"print(light, {name}.__module__, {other!r} in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["True", module, "False"], out.stderr[-2000:]

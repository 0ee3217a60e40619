"""Every command runs torch's CPU threads with a passive OpenMP wait: spinning threads stall a CPU run for seconds
whenever another process holds a core (a DataLoader or decode worker beside the encoder or the training step)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["tokenizer_pipeline", "adapter_trainer"])
def test_importing_a_package_sets_a_passive_wait_unless_the_user_chose(package: str) -> None:
    code = f"import os, {package}; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "PASSIVE"
    chosen = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert chosen.stdout.strip() == "ACTIVE"  # the user's own setting wins

"""benchmarks/mps_attention_memory.py: the math path MPS takes with gradients keeps the S x S probabilities (memory
quadratic in the sequence), CPU's fused kernel does not. The figures behind docs/real-data.md's MPS memory model."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from tests import REPO


def load(name: str, **neighbours: ModuleType) -> ModuleType:
    """benchmarks/ is a directory of scripts, not a package: load one script from its file, without touching sys.path.
    The neighbours it imports by name (`from live_memory import ...`) are answered by modules loaded the same way,
    put in sys.modules only while it loads."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as mp:
        for neighbour, loaded in neighbours.items():
            mp.setitem(sys.modules, neighbour, loaded)
        spec.loader.exec_module(module)
    return module


mam = load("mps_attention_memory", live_memory=load("live_memory"))

H, KV, HD = 8, 2, 16


def test_the_math_path_keeps_the_probabilities_and_flash_does_not() -> None:
    small = {
        s: (mam.attention_bytes(True, 1, H, KV, s, HD), mam.attention_bytes(False, 1, H, KV, s, HD)) for s in (128, 256)
    }
    for s, (math, flash) in small.items():
        probs = H * s * s * 4  # [1, H, S, S] fp32
        assert math["kept_bytes"] >= probs
        assert flash["kept_bytes"] < probs / 4
        assert math["peak_bytes"] >= math["kept_bytes"]
    # doubling S: the math path's memory grows ~4x (quadratic, plus linear k/v copies), flash's ~2x (linear)
    assert small[256][0]["kept_bytes"] > 3 * small[128][0]["kept_bytes"]
    assert small[256][1]["kept_bytes"] < 2.5 * small[128][1]["kept_bytes"]

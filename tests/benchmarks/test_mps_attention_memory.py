"""benchmarks/mps_attention_memory.py: the math path MPS takes with gradients keeps the S x S probabilities (memory
quadratic in the sequence), CPU's fused kernel does not. The figures behind docs/real-data.md's MPS memory model."""

from __future__ import annotations

import importlib.util
import sys

from tests import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # the script imports live_memory as its neighbour
_spec = importlib.util.spec_from_file_location("mps_attention_memory", REPO / "benchmarks" / "mps_attention_memory.py")
mam = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mam)

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

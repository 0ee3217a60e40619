"""The README's `## Use it from Python` example runs as written: its ```python block, executed in a fresh interpreter
whose working directory holds `build/demo/adapter` (as `make demo` leaves it; here exported from a 2-step run of the
tiny demo models on a synthetic set whose codec is a tiny real EnCodec), gives codes and waveforms of the promised
shapes, types and sampling rate."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO

HEADING = "## Use it from Python"
CHECK = """
import json, torch
print("RESULT " + json.dumps({
    "codes": [list(codes.shape), str(codes.dtype)], "wavs": [list(wavs.shape), str(wavs.dtype)],
    "sampling_rate": sampling_rate, "frame_rate": adapter.frame_rate, "finite": bool(torch.isfinite(torch.from_numpy(wavs)).all()),
}))
"""


def python_block(text: str, heading: str = HEADING) -> str:
    """The first ```python block of the section under `heading` (up to the next `## ` heading)."""
    section = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"^```python\n(.*?)^```$", section, re.M | re.S)
    assert m, f"README.md: no ```python block under {heading!r}"
    return m.group(1)


def test_the_block_is_found_where_the_readme_puts_it() -> None:
    text = "# x\n\n## Use it from Python\n\nintro\n\n```python\nprint(1)\n```\n\n## Next\n\n```python\nno\n```\n"
    assert python_block(text) == "print(1)\n"
    with pytest.raises(AssertionError, match="no ```python block"):
        python_block("# x\n\n## Use it from Python\n\n```bash\nls\n```\n\n## Next\n\n```python\nno\n```\n")


@pytest.mark.budget(60, reason="trains and exports a tiny adapter, then runs the example in a fresh interpreter")
def test_the_readme_python_example_runs_as_written(models, tmp_path: Path) -> None:
    import torch

    from tests.trainer.generation.test_api import export_tiny_adapter

    code = python_block((REPO / "README.md").read_text(encoding="utf-8"))
    cwd = tmp_path / "project"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls (tests/trainer/conftest.py's one_thread)
    try:
        export_tiny_adapter(models, tmp_path / "work", cwd / "build" / "demo" / "adapter")
    finally:
        torch.set_num_threads(threads)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code + CHECK], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.split("RESULT ", 1)[1])
    seconds = float(re.search(r"seconds=([\d.]+)", code).group(1))  # type: ignore[union-attr]
    n_texts = len(re.search(r"generate\(\[(.*?)\]", code).group(1).split('", "'))  # type: ignore[union-attr]
    T = round(seconds * got["frame_rate"])
    assert got["codes"] == [[n_texts, 4, T], "torch.int64"]  # [B, K, T]: the demo codec's 4 codebooks
    assert got["wavs"] == [[n_texts, T * 640], "float32"] and got["sampling_rate"] == 32000  # 32 kHz, hop 640
    assert got["finite"]

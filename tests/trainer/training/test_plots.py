"""The run's PNGs: the loss curve is drawn on a fresh machine without matplotlib's font-cache note in the run's
output (Hydra logs at INFO), while every other matplotlib message still shows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_loss_curve_on_a_fresh_machine_prints_no_font_cache_note(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    recs = [{"step": 1, "train/loss": 5.0}, {"step": 2, "train/loss": 4.0, "eval/ce": 4.5, "eval/unigram_ce": 6.0}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in recs))
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
        "from pathlib import Path\n"
        "from adapter_trainer.training.plots import plot_loss_curve\n"
        f"plot_loss_curve(Path({str(metrics)!r}), Path({str(tmp_path / 'loss.png')!r}))\n"
        "logging.getLogger('matplotlib.font_manager').info('another font note')\n"
    )
    env = {"MPLCONFIGDIR": str(tmp_path / "mpl"), "PATH": "/usr/bin:/bin"}  # no font cache yet: a fresh machine
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert (tmp_path / "mpl").is_dir()  # matplotlib did build its cache there
    assert "generated new fontManager" not in out.stderr, out.stderr
    assert "another font note" in out.stderr, out.stderr

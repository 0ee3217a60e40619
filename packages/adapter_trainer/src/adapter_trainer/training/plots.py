"""The PNGs a run writes next to its metrics: the loss curve and the caption gain by frame (matplotlib Agg)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from adapter_trainer.training.metric_logging import read_jsonl


class _FontCacheNote(logging.Filter):
    """Drops matplotlib's INFO line "generated new fontManager", which Hydra's logging shows mid-report."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "generated new fontManager"


def _pyplot():
    """matplotlib.pyplot on the Agg backend (no display), without the font-cache note."""
    font_log = logging.getLogger("matplotlib.font_manager")
    if not any(isinstance(f, _FontCacheNote) for f in font_log.filters):
        font_log.addFilter(_FontCacheNote())
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_loss_curve(metrics_path: Path, out_path: Path) -> Path:
    """Train loss per logged step + eval CE and the unigram baseline, as a PNG."""
    plt = _pyplot()

    recs = read_jsonl(metrics_path)
    train = [(r["step"], r["train/loss"]) for r in recs if "train/loss" in r]
    evals = [(r["step"], r["eval/ce"], r["eval/unigram_ce"]) for r in recs if "eval/ce" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train loss (codes + END)")
    if evals:
        s, ce, uni = zip(*evals)
        ax.plot(s, ce, "o-", label="eval CE (codes)")
        ax.plot(s, uni, "--", label="eval unigram baseline")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("nats / target")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def plot_caption_gain_by_frame(
    gain_by_frame: Sequence[float], by_position: Mapping[str, Mapping], step: int, out_path: Path
) -> Path:
    """The caption gain (CE deranged - CE true, nats/code) per eval-window frame, with each frame range's gain and
    95% interval drawn as a band."""
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    pts = [(t, g) for t, g in enumerate(gain_by_frame) if g is not None and math.isfinite(g)]
    if pts:
        ax.plot(*zip(*pts), ".-", lw=0.8, label="gain per frame (codes of frame t, all codebooks)")
    n = len(gain_by_frame)
    for key, g in by_position.items():
        _, lo_f, hi_f = key.split("_")
        x0, x1 = int(lo_f), n if hi_f == "end" else min(int(hi_f), n)
        lo, hi = g["ci95"]
        if x0 >= x1 or not all(v is not None and math.isfinite(v) for v in (g["gain"], lo, hi)):
            continue
        ax.fill_between([x0, x1 - 1], lo, hi, alpha=0.2)
        ax.hlines(g["gain"], x0, x1 - 1, lw=2, label=f"frames {lo_f}-{hi_f}: {g['gain']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    ax.axhline(0.0, color="k", lw=0.6)
    ax.set_xlabel("audio frame of the eval window (50 frames/s)")
    ax.set_ylabel("caption gain, nats / code")
    ax.set_title(f"caption gain by position, step {step}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path

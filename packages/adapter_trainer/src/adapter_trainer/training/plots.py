"""The loss-curve PNG a run writes next to its metrics (matplotlib Agg: no display needed)."""

from __future__ import annotations

from pathlib import Path

from adapter_trainer.training.metric_logging import read_jsonl


def plot_loss_curve(metrics_path: Path, out_path: Path) -> Path:
    """Train loss per logged step + eval CE and the unigram baseline, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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

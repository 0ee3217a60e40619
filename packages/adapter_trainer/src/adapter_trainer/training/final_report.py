"""The end of a run: final_metrics.json, the loss-curve and caption-gain PNGs, the learning check and the summary."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from adapter_trainer.evaluation.learning_check import learning_check_summary, learning_check_text
from adapter_trainer.evaluation.report import EvalReport
from adapter_trainer.training.checkpoint import TrainingProgress
from adapter_trainer.training.metric_logging import finite_or_none
from adapter_trainer.training.plots import plot_caption_gain_by_frame, plot_loss_curve


def final_metrics(
    r: EvalReport, progress: TrainingProgress, *, wall_s: float, ckpt: Path, figures: dict[str, float] | None = None
) -> dict[str, Any]:
    """What recipe_main returns and final_metrics.json holds (the model's own figures at the top level)."""
    return {
        "step": progress.step,
        "learning_check": learning_check_summary(r),
        "eval": r.to_dict(),
        "progress": asdict(progress),
        "wall_time_s": wall_s,
        "checkpoint": str(ckpt),
        **(figures or {}),
    }


def write_final_report(output_dir: Path, final: dict[str, Any], r: EvalReport, progress: TrainingProgress) -> None:
    """Rank 0: write final_metrics.json and the PNGs, print the learning-check block and the one-line summary."""
    step, wall, ckpt = final["step"], final["wall_time_s"], final["checkpoint"]
    (output_dir / "final_metrics.json").write_text(json.dumps(finite_or_none(final), indent=2, allow_nan=False) + "\n")
    plot_path = plot_loss_curve(output_dir / "metrics.jsonl", output_dir / "loss_curve.png")
    plot_caption_gain_by_frame(
        r.caption_gain_by_frame, r.caption_gain_by_position, step, output_dir / "caption_gain_by_frame.png"
    )
    print(learning_check_text(r))
    print(
        f"summary: {step} steps, {progress.tokens_seen:,} tokens, {wall:.1f} s wall, epoch "
        f"{progress.epoch}; wrote {output_dir / 'final_metrics.json'}, {plot_path}, {ckpt}"
    )

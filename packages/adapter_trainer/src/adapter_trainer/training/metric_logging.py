"""Metric loggers behind one small Protocol (torchtune style): JSONL, TensorBoard, and a fan-out of both."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

Scalar = float | int


@runtime_checkable
class MetricLogger(Protocol):
    """Anything that takes a dict of scalars at a step."""

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class CurveLogger(Protocol):
    """A logger that also takes a curve (values by an index other than the step, e.g. the caption gain by frame)."""

    def log_curve(self, tag: str, values: Sequence[float], step: int) -> None: ...


def _whole_lines(path: Path) -> list[str]:
    """The non-empty lines of a metrics.jsonl; a last line torn by a run killed mid-write (not JSON) is left out."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    if lines:
        try:
            json.loads(lines[-1])
        except ValueError:
            lines.pop()
    return lines


class JsonlLogger:
    """One JSON object per call, `{"step": N, **payload}`, appended to `path` (flushed every line). On resume,
    `truncate_after_step=S` drops the records after the checkpoint, so the file reads as one continuous run."""

    def __init__(self, path: str | Path, truncate_after_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after_step is not None and self.path.exists():
            kept = [ln for ln in _whole_lines(self.path) if json.loads(ln)["step"] <= truncate_after_step]
            self.path.write_text("".join(ln + "\n" for ln in kept))
        elif truncate_after_step is None and self.path.exists():
            self.path.unlink()  # fresh run in an existing dir: start a fresh file
        self._f = self.path.open("a", encoding="utf-8")

    def steps_with(self, key: str) -> set[int]:
        """Steps of the records (kept so far) that hold `key`, e.g. the evals a resumed run already logged."""
        if not self.path.exists():
            return set()
        recs = (json.loads(ln) for ln in _whole_lines(self.path))
        return {int(r["step"]) for r in recs if key in r}

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        record = {"step": int(step)}
        for k, v in payload.items():
            v = float(v)
            record[k] = v if math.isfinite(v) else str(v)  # JSON has no NaN/inf: keep them readable
        self._f.write(json.dumps(record, allow_nan=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


class TensorBoardLogger:
    """`SummaryWriter.add_scalar` per key; view with `tensorboard --logdir <log_dir>`."""

    def __init__(self, log_dir: str | Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imported lazily: pulls in tensorboard

        # purge_step drops events at or after it (left by a run that died after its last checkpoint)
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        for k, v in payload.items():
            self._writer.add_scalar(k, float(v), global_step=int(step))
        self._writer.flush()

    def log_curve(self, tag: str, values: Sequence[float], step: int) -> None:
        """One chart per training step, `<tag>/step_<step>`, over the value's index; non-finite values left out."""
        name = f"{tag}/step_{int(step):06d}"
        for i, v in enumerate(values):
            if v is not None and math.isfinite(float(v)):
                self._writer.add_scalar(name, float(v), global_step=i)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class FanOutLogger:
    """Sends every call to each logger in order."""

    def __init__(self, loggers: Sequence[MetricLogger]) -> None:
        self.loggers = list(loggers)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        for lg in self.loggers:
            lg.log_dict(payload, step)

    def log_curve(self, tag: str, values: Sequence[float], step: int) -> None:
        """To the loggers that take curves (TensorBoard); metrics.jsonl keeps scalars only."""
        for lg in self.loggers:
            if isinstance(lg, CurveLogger):
                lg.log_curve(tag, values, step)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()


def open_run_loggers(output_dir: Path, *, tensorboard: bool, resume_step: int | None) -> tuple[FanOutLogger, set[int]]:
    """Rank 0's loggers (metrics.jsonl, and TensorBoard under tb/) and the steps whose eval metrics.jsonl holds."""
    jsonl = JsonlLogger(output_dir / "metrics.jsonl", truncate_after_step=resume_step)
    logged_eval_steps = jsonl.steps_with("eval/ce")
    loggers: list[MetricLogger] = [jsonl]
    if tensorboard:
        loggers.append(TensorBoardLogger(output_dir / "tb", purge_step=(resume_step + 1) if resume_step else None))
    return FanOutLogger(loggers), logged_eval_steps


def read_jsonl(path: str | Path) -> list[dict]:
    """All records of a metrics.jsonl file (for plots and tests)."""
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


def finite_or_none(x: Any) -> Any:
    """NaN/inf -> None recursively, so final_metrics.json is strict JSON (e.g. END CE when no clip ends in the window)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    return x

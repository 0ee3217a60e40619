"""Stage 1's progress moves a clip at a time: on a terminal a bar with audio-s/s and an ETA, on a log file or a
pipe plain lines (no carriage returns), one per interval and one at the end."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.pipeline.helpers import pipeline_config
from tokenizer_pipeline.hydra_cli import quiet_loading_bars
from tokenizer_pipeline.run import clip_progress
from tokenizer_pipeline.run.clip_progress import ClipProgress
from tokenizer_pipeline.run.pipeline import run_pipeline


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_moves_per_clip_with_its_rate() -> None:
    out = Terminal()
    shown = ClipProgress(4, "encode", show=True, stream=out)
    for _ in range(3):
        shown.update(2.5)
    assert shown.bar.n == 3 and "audio-s/s" in str(shown.bar)
    shown.close()
    assert "\r" in out.getvalue() and "3/4" in out.getvalue()


def test_a_log_gets_plain_lines_per_interval_and_at_the_end() -> None:
    out = io.StringIO()
    shown = ClipProgress(4, "encode", show=True, stream=out, interval_s=0.0)
    for _ in range(4):
        shown.update(2.5)
    shown.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert [line.split(":")[1].split("clips")[0].strip() for line in lines] == ["1/4", "2/4", "3/4", "4/4", "4/4"]
    assert "audio-s/s" in lines[-1] and "0 s left" in lines[-1]


def test_nothing_is_shown_off_rank_0() -> None:
    out = io.StringIO()
    shown = ClipProgress(2, "encode", show=False, stream=out, interval_s=0.0)
    shown.update(1.0)
    shown.close()
    assert out.getvalue() == ""


def test_a_run_logged_to_a_file_prints_its_progress_lines(
    corpus, tiny_codec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    csv_path, audio_dir, rows = corpus
    monkeypatch.setattr(clip_progress, "LINE_EVERY_S", 0.0)
    quiet_loading_bars()  # what every command does first (hydra_cli.refusals_in_one_line): stderr is no terminal here
    run_pipeline(pipeline_config(csv_path, audio_dir, tmp_path / "out", tiny_codec), progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert f"encode: {len(rows)}/{len(rows)} clips (100%)" in err
    assert sum(line.startswith("encode: ") for line in err.splitlines()) == len(rows) + 1

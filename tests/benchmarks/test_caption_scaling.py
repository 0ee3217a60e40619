"""benchmarks/caption_scaling.py: the held-out captions are shared by every point, the train sets are nested, and the
trend fit recovers a known slope (the curve itself is a benchmark, never a test)."""

from __future__ import annotations

import csv
import importlib.util
import math
from argparse import Namespace
from pathlib import Path

import pytest

from tokenizer_pipeline.demo.standin_corpus import select_rows

REPO = Path(__file__).resolve().parents[2]
# benchmarks/ is a directory of scripts, not a package: load the one script without touching sys.path
_spec = importlib.util.spec_from_file_location("caption_scaling", REPO / "benchmarks" / "caption_scaling.py")
caption_scaling = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(caption_scaling)


def test_every_point_shares_the_held_out_rows_and_train_sets_are_nested(tmp_path: Path) -> None:
    rows_csv = caption_scaling.write_rows_csv(tmp_path, n_eval=80, seed=0)
    with rows_csv.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert sum(r["is_audioset_eval"] == "True" for r in rows) == 80
    picked = {}
    for n in (240, 960, 3840):  # what the stand-in corpus renders for each point (its own row selection)
        idx = select_rows(rows, n + 80, 80 / (n + 80), seed=0)
        picked[n] = {rows[i]["ytid"] for i in idx if rows[i]["is_audioset_eval"] == "False"}
        held_out = {rows[i]["ytid"] for i in idx if rows[i]["is_audioset_eval"] == "True"}
        assert len(picked[n]) == n and len(held_out) == 80
    assert picked[240] < picked[960] < picked[3840]


def test_clip_length_keeps_the_audio_seconds_down_to_the_shortest_clip() -> None:
    args = Namespace(train_seconds=2400.0, min_duration_s=2.5)
    assert [caption_scaling.duration_for(n, args) for n in (120, 240, 960, 3840)] == [10.0, 10.0, 2.5, 2.5]


def test_the_log2_fit_recovers_a_known_slope_and_predicts_musiccaps() -> None:
    points = [{"captions": n, "g": 0.01 + 0.02 * math.log2(n / 240)} for n in (240, 960, 3840) for _ in range(3)]
    fit = caption_scaling.fit_log2(points, "g")
    assert fit["per_doubling"] == pytest.approx(0.02, abs=1e-9)
    assert fit["rmse"] == pytest.approx(0.0, abs=1e-9)
    assert fit["predicted"]["all of MusicCaps (5,521)"] == pytest.approx(0.01 + 0.02 * math.log2(5521 / 240))
    assert caption_scaling.fit_log2(points[:3], "g") is None  # one caption count: no trend to state


def test_each_run_is_planned_once_and_a_scaled_run_with_the_fixed_steps_is_the_fixed_run() -> None:
    args = Namespace(seeds=[1234, 1, 2], schedules=["fixed", "scaled"], steps=600, max_steps=4800)
    runs = caption_scaling.plan_runs([240, 960, 3840], args)
    assert len(runs) == len(set(runs)) == 3 + 6 + 6  # 240: scaled == fixed (600 steps)
    assert {r[2] for r in runs if r[0] == 960} == {600, 2400}
    assert {r[2] for r in runs if r[0] == 3840} == {600, 4800}  # 9600 capped at --max-steps
    assert [r[0] for r in runs] == sorted(r[0] for r in runs)  # by point: a point's runs start with its shards
    assert caption_scaling.run_dir_for(Path("o"), 240, 1, 600).name == "steps600-s1"


def test_a_point_nested_in_a_smaller_one_of_the_same_clip_length_encodes_only_the_rows_it_adds(tmp_path: Path) -> None:
    args = Namespace(train_seconds=2400.0, min_duration_s=2.5)
    assert caption_scaling.nested_in(3840, [240, 960, 3840], args) == 960  # both 2.5-s clips
    assert caption_scaling.nested_in(960, [240, 960, 3840], args) is None  # 240 has 10-s clips
    rows_csv = caption_scaling.write_rows_csv(tmp_path, n_eval=8, seed=0)
    with rows_csv.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    for n in (16, 48):  # the rows each point's corpus holds, as the stand-in corpus selects them
        (tmp_path / f"c{n}" / "corpus").mkdir(parents=True)
        with (tmp_path / f"c{n}" / "corpus" / "musiccaps-subset.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows[i] for i in select_rows(rows, n + 8, 8 / (n + 8), seed=0))
    with caption_scaling._write_added_rows(tmp_path, 48, 16).open(newline="", encoding="utf-8") as f:
        added = list(csv.DictReader(f))
    assert len(added) == 32 and all(r["is_audioset_eval"] == "False" for r in added)


def test_the_bar_needs_every_figure_and_the_table_counts_seeds_meeting_it() -> None:
    ok = {"captions": 960, "steps": 600, "schedule": "fixed", "seed": 1, "gain_first10": 0.12,
          "gain_first10_ci95": [0.01, 0.2], "probe_fraction": 0.6, "ce_rel_pct": 21.0, "gain_window": 0.05}  # fmt: skip
    assert caption_scaling.meets_targets(ok)
    for change in ({"gain_first10": 0.09}, {"gain_first10_ci95": [-0.01, 0.2]}, {"probe_fraction": 0.49},
                   {"probe_fraction": None}, {"ce_rel_pct": 19.9}):  # fmt: skip
        assert not caption_scaling.meets_targets({**ok, **change})
    table = caption_scaling.means_md({"points": [ok, {**ok, "seed": 2, "probe_fraction": 0.4}]})
    assert "| fixed | 960 | 600 | 2 |" in table[2] and table[2].endswith("| 1 of 2 |")


def test_a_stage_another_process_still_runs_is_waited_for_and_a_dead_ones_lock_is_not(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    lock = tmp_path / "c960-shards.log.lock"
    # 0.6 s of life is ample: a waiter that did not wait returns at once, one that waited takes >= 0.6 s
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    lock.write_text(f"{proc.pid}\n")
    t0 = time.time()
    caption_scaling.wait_for_lock(lock, poll_s=0.1)  # returns on the first poll after the process ended
    assert proc.poll() is not None and time.time() - t0 >= 0.5
    lock.write_text(f"{proc.pid}\n")  # that process is gone now
    t0 = time.time()
    caption_scaling.wait_for_lock(lock)
    assert time.time() - t0 < 1.0


def test_the_pool_runs_queued_jobs_lowest_priority_first_and_hands_errors_to_the_waiter() -> None:
    import threading

    pool, gate, order = caption_scaling.PriorityPool(1), threading.Event(), []
    try:
        first = pool.submit((1, 0), gate.wait)  # holds the only worker while the rest queue up
        jobs = [pool.submit(p, order.append, name) for p, name in
                [((1, 2400, 960), "scaled 960"), ((1, 600, 3840), "fixed 3840"), ((0, 3840), "shards")]]  # fmt: skip
        failing = pool.submit((2,), caption_scaling.duration_for, 1, None)  # AttributeError inside the job
        gate.set()
        assert first.result(timeout=5) and all(j.result(timeout=5) is None for j in jobs)
        assert order == ["shards", "fixed 3840", "scaled 960"]
        with pytest.raises(AttributeError):
            failing.result(timeout=5)
    finally:
        gate.set()
        pool.shutdown()


def test_training_runs_use_random_crops_unless_an_override_says_otherwise(tmp_path: Path, monkeypatch) -> None:
    """The demo preset now starts every crop at frame 0; the curve was measured with random crops, so its runs pin
    data.start_crop_prob=0.0 and a knob sweep's own override (given later on the command line) wins."""
    cmds: list[list[str]] = []
    monkeypatch.setattr(caption_scaling, "run", lambda cmd, log, threads=None: cmds.append(cmd) or 0.0)
    args = Namespace(parallel=1, generate_n=-1, overrides=[])
    caption_scaling.train_and_probe("python", tmp_path, [tmp_path / "shards"], 960, 1, 600, args)
    args.overrides = ["data.start_crop_prob=1.0"]
    caption_scaling.train_and_probe("python", tmp_path / "knob", [tmp_path / "shards"], 960, 1, 600, args)

    def crop(cmd: list[str]) -> str:  # Hydra applies overrides in order: the last one is the value
        return [a for a in cmd if a.startswith("data.start_crop_prob=")][-1]

    assert [crop(c) for c in cmds] == ["data.start_crop_prob=0.0", "data.start_crop_prob=1.0"]

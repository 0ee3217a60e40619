"""The demo build's sizes are checked before any work starts, and a build made with other settings is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenizer_pipeline.demo.build_settings import SETTINGS_JSON, check_sizes, check_stamp
from tokenizer_pipeline.errors import ConfigError
from tokenizer_pipeline.standin_corpus import main


@pytest.mark.parametrize(
    ("n_clips", "fraction", "seconds", "codec_clips", "fix"),
    [
        (200, 0.0, 2.5, 160, "eval split would be empty"),
        (200, 0.002, 2.5, 160, "eval split would be empty"),  # rounds to 0 held out
        (200, 1.0, 2.5, 160, "leaves no train clip"),
        (200, 0.1, 2.5, 131, "DEMO_CODEC_CLIPS >= 132"),  # 131 x 125 frames < 8 per code x 2048 codes
        (400, 0.1, 1.0, 327, "DEMO_CODEC_CLIPS >= 328"),  # 327 x 50 frames < 16,384
        (140, 0.1, 2.5, 150, "more than the corpus"),
        (200, 0.1, 0.0, 160, "DEMO_SECONDS=0 must be > 0"),
    ],
)
def test_sizes_that_cannot_give_a_demo_are_refused_naming_the_variable(
    n_clips: int, fraction: float, seconds: float, codec_clips: int, fix: str
) -> None:
    with pytest.raises(ConfigError, match="the demo's sizes cannot work") as e:
        check_sizes(n_clips, fraction, seconds, codec_clips)
    assert fix in str(e.value)


def test_sizes_that_work_pass_and_a_small_eval_split_is_a_warning() -> None:
    assert check_sizes(1040, 0.0769, 2.5, 160) == []  # 80 eval clips; 160 x 125 = 20,000 frames >= 8 x 2048
    assert check_sizes(240, 0.125, 2.5, 132) == []  # make demo-quick's 30 eval clips
    (warning,) = check_sizes(200, 0.1, 2.5, 140)  # 20 eval clips
    assert "20 eval clips" in warning and "INSUFFICIENT" in warning


def test_a_build_made_with_other_settings_is_refused_naming_both_values(tmp_path: Path) -> None:
    settings = {"DEMO_CLIPS": "1040", "DEMO_CODEC_WIDTH": "16"}
    check_stamp(tmp_path / "demo", settings)  # a new build records them
    assert json.loads((tmp_path / "demo" / SETTINGS_JSON).read_text()) == settings
    check_stamp(tmp_path / "demo", dict(settings))  # the same settings: nothing to say
    with pytest.raises(ConfigError) as e:
        check_stamp(tmp_path / "demo", settings | {"DEMO_CODEC_WIDTH": "8"})
    msg = str(e.value)
    assert "DEMO_CODEC_WIDTH: built 16, asked 8" in msg and f"rm -rf {tmp_path / 'demo'}" in msg
    assert "DEMO_CODEC_WIDTH=16" in msg and "DEMO_CLIPS" not in msg.split("(")[1]
    (tmp_path / "demo" / SETTINGS_JSON).write_text("{not json")
    with pytest.raises(ConfigError, match="not a settings file"):
        check_stamp(tmp_path / "demo", settings)


def test_the_command_make_runs_exits_2_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--check-built", "--out", str(tmp_path / "demo" / "corpus"), "--build-dir", str(tmp_path / "demo")]
    sizes = ["--n-clips", "100", "--duration-s", "2.5", "--eval-fraction", "0.0"]
    assert main([*base, *sizes, "--codec-clips", "40"]) == 2
    assert "eval split would be empty" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()  # refused before anything is written
    ok = ["--n-clips", "400", "--duration-s", "2.5", "--eval-fraction", "0.1", "--codec-clips", "160"]
    assert main([*base, *ok, "--setting", "DEMO_CODEC_WIDTH=16"]) == 0
    assert main([*base, *ok, "--setting", "DEMO_CODEC_WIDTH=8"]) == 2
    assert "DEMO_CODEC_WIDTH: built 16, asked 8" in capsys.readouterr().err
    assert main([*base, *ok, "--setting", "WIDTH16"]) == 2
    assert "expected NAME=VALUE" in capsys.readouterr().err
    for bad in ("0", "-5", "1e3", "many"):
        assert main([*base, *ok, "--setting", f"MUSIC_PRETRAIN_STEPS={bad}"]) == 2
        assert f"MUSIC_PRETRAIN_STEPS={bad} must be a whole number >= 1" in capsys.readouterr().err
    assert main([*base, *ok, "--setting", "DEMO_CODEC_WIDTH=16", "--count", "DEMO_STEPS=0"]) == 2
    assert "DEMO_STEPS=0 must be a whole number" in capsys.readouterr().err
    for steps in ("", "50", "600"):  # the run's steps are checked, not recorded: any may follow any
        assert main([*base, *ok, "--setting", "DEMO_CODEC_WIDTH=16", "--count", f"DEMO_STEPS={steps}"]) == 0

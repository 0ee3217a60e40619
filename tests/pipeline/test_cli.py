"""The Hydra CLI as users run it (subprocesses), and every YAML composed against the schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO
from tests.pipeline.helpers import MUSICCAPS_CSV
from tokenizer_pipeline.__main__ import PipelineConfig, config_from_overrides
from tokenizer_pipeline.hydra_cli import find_conf_dir


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_explain_and_missing_audio_dir_exit_2(tmp_path: Path) -> None:
    r = _run(["-m", "tokenizer_pipeline", "--explain"], tmp_path)
    assert r.returncode == 2 and "make shards DATA=" in r.stdout and "make demo-shards" in r.stdout
    assert "{ytid}" in r.stdout and "make audio OUT=" in r.stdout
    r = _run(["-m", "tokenizer_pipeline", "out_dir=x"], tmp_path)
    assert r.returncode == 2 and "audio_dir is required" in r.stderr and "make demo-shards" in r.stderr


@pytest.mark.budget(60, reason="real stage-1 and verify subprocesses: codec load, encoding, hashing")
def test_cli_end_to_end_then_verify(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    work = tmp_path / "launch"
    work.mkdir()
    args = ["-m", "tokenizer_pipeline", f"csv={csv_path}", f"audio_dir={audio_dir}", "out_dir=shards",
            f"codec.name_or_path={tiny_codec}", "codec.device=cpu", "shard.max_samples=4", "min_seconds=0.5"]  # fmt: skip
    r = _run(args, work)
    assert r.returncode == 0, r.stderr
    assert "train: 4 encoded, 0 failed" in r.stdout
    # it ends with what comes next: check the set, train on it (the list quoted for zsh)
    assert "next: python -m tokenizer_pipeline.verify shards" in r.stdout
    assert "python -m adapter_trainer +experiment=cuda_1b 'data.shards=[shards]'" in r.stdout
    assert sorted(p.name for p in work.iterdir()) == ["shards"]  # relative to launch dir; no outputs/ or .hydra litter
    m = json.loads((work / "shards/manifest.json").read_text())
    assert m["config"]["shard"]["max_samples"] == 4 and m["config"]["out_dir"] == "shards"
    r = _run(["-m", "tokenizer_pipeline.verify", "shards"], work)
    assert r.returncode == 0 and r.stdout.startswith("OK shards: 2 shards, 7 samples")
    # a changed config into the same directory is refused with the fix
    r = _run([*args, "shard.max_samples=2"], work)
    assert r.returncode == 2 and "overwrite=true" in r.stderr
    # corrupt a shard: verify exits non-zero and names it
    tar = work / "shards/train/shard-000000.tar"
    tar.write_bytes(tar.read_bytes()[:-1024])
    r = _run(["-m", "tokenizer_pipeline.verify", "shards"], work)
    assert r.returncode == 1 and "train/shard-000000.tar" in r.stderr


@pytest.mark.parametrize("overrides", [["audio_dir=/a"], ["+preset=demo"]])
def test_every_yaml_composes_to_the_schema(overrides: list[str]) -> None:
    cfg = config_from_overrides(overrides)
    assert isinstance(cfg, PipelineConfig)
    assert cfg.codec.dtype == "float32" and cfg.max_failure_fraction == 0.5 and cfg.overwrite is False
    assert cfg.audio_ext[0] == "wav" and cfg.crop_to_window is False
    assert cfg.workers is None and cfg.prefetch == 4
    assert cfg.threads == (1 if overrides == ["+preset=demo"] else None)  # the demo encodes on one thread
    if overrides == ["+preset=demo"]:
        assert cfg.csv == "build/demo/corpus/musiccaps-subset.csv" and cfg.audio_dir == "build/demo/corpus"
        assert cfg.codec.name_or_path == "build/demo/codec" and cfg.out_dir == "build/demo/shards"
        assert cfg.shard.max_samples == 32
        assert cfg.duration_tolerance_s == PipelineConfig().duration_tolerance_s  # make demo-shards passes the demo's
    else:
        assert cfg.codec.name_or_path == "facebook/encodec_32khz" and cfg.csv == "data/musiccaps/musiccaps-public.csv"
    yamls = sorted(p.relative_to(find_conf_dir()).as_posix() for p in find_conf_dir().rglob("*.yaml"))
    # a new YAML must be added to a test (download.yaml: fetch/test_download.py; decode.yaml: codec/test_decode.py)
    assert yamls == [
        "decode.yaml", "download.yaml", "preset/demo.yaml", "shards.yaml", "source/audiocraft.yaml", "source/audiofolder.yaml",
        "source/musiccaps.yaml",
    ]  # fmt: skip
    assert cfg.source.kind == "musiccaps" and cfg.segment.seconds == 10.0 and cfg.split.eval_fraction == 0.1


@pytest.mark.parametrize("kind, key", [("audiocraft", "manifest"), ("audiofolder", "dir")])
def test_source_yamls_compose_without_audio_dir(kind: str, key: str) -> None:
    cfg = config_from_overrides([f"source={kind}", f"source.{key}=/x", "segment.hop_seconds=5"])
    assert cfg.source.kind == kind and getattr(cfg.source, key) == "/x" and cfg.audio_dir is None
    assert cfg.source.caption_column == {"audiocraft": "description", "audiofolder": "caption"}[kind]
    assert cfg.segment.hop_seconds == 5.0 and cfg.csv == "data/musiccaps/musiccaps-public.csv"
    assert find_conf_dir() == REPO / "conf" / "tokenizer_pipeline"


def test_unknown_key_is_rejected() -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="batchsize"):
        config_from_overrides(["audio_dir=/a", "codec.batchsize=3"])
    # codec.batch_size is an int or auto (OmegaConf has no int-or-string type): run_pipeline refuses anything else
    assert config_from_overrides(["audio_dir=/a", "codec.batch_size=many"]).codec.batch_size == "many"
    assert config_from_overrides(["audio_dir=/a", "codec.batch_size=4"]).codec.batch_size == 4
    assert config_from_overrides(["audio_dir=/a"]).codec.batch_size == "auto"


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["-m", "tokenizer_pipeline.standin_corpus", "--csv", "missing.csv", "--out", "c"]
            + ["--n-clips", "8", "--eval-fraction", "0.25"],
            "MusicCaps CSV not found",
        ),
        (
            ["-m", "tokenizer_pipeline.standin_corpus", "--csv", str(MUSICCAPS_CSV), "--out", "c", "--n-clips", "0"]
            + ["--eval-fraction", "0.25"],
            "--n-clips must be >= 1",
        ),
        (
            ["-m", "tokenizer_pipeline.demo_codec", "--corpus", ".", "--out", "codec", "--n-clips", "40"],
            "run `make corpus` first",
        ),
        (
            ["-m", "tokenizer_pipeline.decode", "shards", "out_dir=d", "limit=abc"],
            "limit takes a whole number, not 'abc'",
        ),
        (["-m", "tokenizer_pipeline.decode", "shards", "out_dir=d", "+limt=3"], "did you mean limit=3?"),
        (["-m", "tokenizer_pipeline.decode", "shards", "out_dir=d", "outdir=e"], "did you mean out_dir=e?"),
        (["-m", "tokenizer_pipeline", "source=audiocraft", "out_dir=c"], "needs source.manifest="),
        (
            ["-m", "tokenizer_pipeline", "source=audiocraft", "source.manifest=m.jsonl", "out_dir=c"],
            "manifest not found",
        ),
        (["-m", "tokenizer_pipeline", "source=audiofolder", "source.dir=nowhere", "out_dir=c"], "is not a directory"),
        (
            ["-m", "tokenizer_pipeline", "source=audiofolder", "source.dir=.", "source.caption=auto", "out_dir=c"],
            "source.caption='auto' is not one of",
        ),
    ],
)
def test_user_errors_of_every_command_exit_2_without_traceback(tmp_path: Path, args: list[str], message: str) -> None:
    r = _run(args, tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "c").exists() and not (tmp_path / "codec").exists()  # refused before writing


@pytest.mark.parametrize(
    "override, must_say",
    [
        ("limt=5", "did you mean limit=5?"),  # Hydra: "use +limt=5"
        ("+limt=5", "did you mean limit=5?"),  # Hydra: runs every row, limit unchanged
        ("+codec.batchsize=4", "did you mean codec.batch_size=4?"),
        ("preset=demo", "add a +: +preset=demo"),
        ("+source=audiofolder", "drop the +: source=audiofolder"),
    ],
)
def test_an_unknown_key_is_refused_in_one_line_before_anything_is_read(
    tmp_path: Path, override: str, must_say: str
) -> None:
    # a missing audio_dir would be refused next: the key is refused first
    r = _run(["-m", "tokenizer_pipeline", "audio_dir=nowhere", "out_dir=c", override], tmp_path)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and must_say in err, err
    assert "Traceback" not in err and "HYDRA_FULL_ERROR" not in err and not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "override, must_say",
    [
        ("+limt=5", "did you mean limit=5?"),  # Hydra: fetches every row, limit unchanged
        ("worker=2", "did you mean workers=2?"),
        ("+yt_dlp_params.sleep_interval=1", None),  # an open dict: any yt-dlp parameter passes, with its +
        ("+yt_dlp_params={sleep_interval: 1}", None),
        ("yt_dlp_params.sleep_interval=1", "add a +: +yt_dlp_params.sleep_interval=1"),  # Hydra: "not in struct"
        ("preset=demo", "preset is not a config key"),  # stage 1's groups are not download's
    ],
)
def test_download_refuses_an_unknown_key_before_any_row_is_fetched(
    tmp_path: Path, override: str, must_say: str | None
) -> None:
    # a CSV that does not exist: refused next when the key passes, so nothing is fetched in either case
    r = _run(["-m", "tokenizer_pipeline.download", "out_dir=c", "csv=missing.csv", override], tmp_path)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert (must_say in err) if must_say else "missing.csv" in err, err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "args, must_say",
    [
        # an empty folder: before, the codec loaded, 5,521 rows ran through the bar and 23 empty shards were written
        (
            [f"csv={MUSICCAPS_CSV}", "audio_dir=empty"],
            "audio_dir=empty holds no {ytid}.<ext> file of the CSV's 5521 rows",
        ),
        # a folder of audio named otherwise (not after the CSV's ytids)
        ([f"csv={MUSICCAPS_CSV}", "audio_dir=other"], "2 audio files there, none named after a CSV row"),
        ([f"csv={MUSICCAPS_CSV}", "audio_dir=nowhere"], "audio_dir=nowhere is not a directory"),
        ([f"csv={MUSICCAPS_CSV}", "audio_dir=empty", "out_dir=/dev/null/c"], "out_dir=/dev/null/c cannot be written"),
    ],
)
def test_inputs_are_checked_in_one_line_before_the_codec_loads(tmp_path: Path, args: list[str], must_say: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    for name in ("my-song.wav", "b.flac"):
        (tmp_path / "other" / name).write_bytes(b"")
    # a codec that does not exist: refused first, the run would name it instead
    r = _run(["-m", "tokenizer_pipeline", "out_dir=c", "codec.name_or_path=no-codec", *args], tmp_path)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and must_say in err, err
    assert ("--explain" in err) == ("out_dir" not in must_say) and "no-codec" not in err
    assert not (tmp_path / "c").exists()

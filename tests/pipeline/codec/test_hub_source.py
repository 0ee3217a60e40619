"""The codec named by a Hub id (codec/hub_source.py): through the real huggingface_hub against a loopback stand-in
of the Hub's answers, a codec the Hub cannot serve stops stage 1 in one line naming the cause, or is read from the
cache with a note; offline mode never asks; the stage-1 command on a machine without a network fails at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from tests.hub_stand_in import HubAnswers, in_a_folder_with_build, put_in_cache, stand_in_hub
from tokenizer_pipeline.codec.hub_source import local_files_only
from tokenizer_pipeline.errors import ConfigError

REPO_ID = "facebook/encodec_32khz"


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    with stand_in_hub() as url:
        monkeypatch.setattr(constants, "ENDPOINT", url)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        yield url


@pytest.mark.parametrize(
    "answer, says",
    [
        ((403, "GatedRepo"), "is gated: accept its licence at {hub}/facebook/encodec_32khz, then `hf auth login`"),
        ((404, "RepoNotFound"), "is not on the Hub ({hub}) for your account: check codec.name_or_path"),
        ((401, "BadToken"), "refused your token: `hf auth login` again, or fix HF_TOKEN"),
        ((200, "HTML"), "is not the Hub's (a proxy or captive portal page?)"),
    ],
)
def test_a_codec_the_hub_does_not_serve_is_one_line_naming_the_cause(hub: str, answer, says: str) -> None:
    HubAnswers.answers = {REPO_ID: answer}
    with pytest.raises(ConfigError) as e:
        local_files_only(REPO_ID)
    msg = str(e.value)
    assert says.format(hub=hub) in msg and f"`hf download {REPO_ID}`" in msg and "\n" not in msg, msg


def test_a_passing_hub_error_is_left_to_the_download_and_a_bad_name_is_one_line(
    hub: str, capsys: pytest.CaptureFixture[str]
) -> None:
    HubAnswers.answers = {REPO_ID: (503, None)}
    assert local_files_only(REPO_ID) is False and "answered 503" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"C:\\codecs\\x: neither an existing directory nor a Hub id"):
        local_files_only("C:\\codecs\\x")


def test_served_downloads_cached_reads_the_cache_offline_never_asks(
    hub: str, tiny_codec: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    HubAnswers.answers = {REPO_ID: (200, None)}
    assert local_files_only(REPO_ID) is False
    put_in_cache(Path(constants.HF_HUB_CACHE), tiny_codec, REPO_ID)
    HubAnswers.answers = {}  # gone from the Hub (or a typo'd mirror): the cached copy is read, with a note
    assert (
        local_files_only(REPO_ID) is True
        and "reading facebook/encodec_32khz from the Hugging" in capsys.readouterr().err
    )
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # offline mode must not even try this
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert local_files_only(REPO_ID) is True and capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match=r"offline mode \(HF_HUB_OFFLINE=1 or TRANSFORMERS_OFFLINE=1\) forbids"):
        local_files_only("facebook/encodec_48khz")


def test_stage_1_without_a_network_stops_at_once_without_retries(tmp_path: Path) -> None:
    (tmp_path / "audio").mkdir()
    (tmp_path / "audio" / "a.wav").write_bytes(b"")
    header = (
        "ytid,start_s,end_s,audioset_positive_labels,aspect_list,caption,author_id,is_balanced_subset,is_audioset_eval"
    )
    (tmp_path / "rows.csv").write_text(f"{header}\na,0,10,/m/1,\"['piano']\",calm piano,1,False,False\n")
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path / "cache"),
           "HF_HUB_OFFLINE": "0", "OMP_NUM_THREADS": "1"}  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-m", "tokenizer_pipeline", "audio_dir=audio", "csv=rows.csv", "out_dir=out",
         f"codec.name_or_path={REPO_ID}"], cwd=tmp_path, env=env, text=True, capture_output=True,
    )  # fmt: skip
    err = r.stderr.strip()
    assert r.returncode == 2 and "cannot reach the Hub at http://127.0.0.1:9" in err, err[-2000:]
    assert "Retrying" not in err and "Traceback" not in err and len(err.splitlines()) == 1, err[-2000:]


def test_a_missing_codec_directory_under_an_existing_one_is_not_read_as_a_hub_id(
    hub: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenizer_pipeline.codec.encode import CodecEncoder

    in_a_folder_with_build(tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match=r"codec directory build/codec does not exist"):
        CodecEncoder("build/codec")

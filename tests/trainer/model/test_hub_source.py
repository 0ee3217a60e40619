"""A model named by a Hub id (model/hub_source.py): the real cause of a failed load in one line, at once, through the
real huggingface_hub against a loopback stand-in of the Hub's auth-check answers: gated, not found, unreachable,
offline mode; and a cached model read from the cache when the Hub cannot serve it, without transformers' retries."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants

from adapter_trainer.model import hub_source
from adapter_trainer.model.builders import load_musicgen_decoder_config
from tests import REPO
from tests.hub_stand_in import HubAnswers, in_a_folder_with_build, put_in_cache, stand_in_hub

REPO_ID = "facebook/musicgen-small"


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """The stand-in Hub's URL as huggingface_hub's endpoint, an empty HF cache, a fresh decision per test."""
    with stand_in_hub() as url:
        monkeypatch.setattr(constants, "ENDPOINT", url)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(hub_source, "_decided", {})
        yield url


def test_a_gated_model_names_the_licence_and_the_login(hub: str) -> None:
    HubAnswers.answers = {"meta-llama/Llama-3.2-1B": (403, "GatedRepo")}
    with pytest.raises(hub_source.ModelSourceError) as e:
        hub_source.cache_only("meta-llama/Llama-3.2-1B")
    msg = str(e.value)
    assert "is gated" in msg and f"{hub}/meta-llama/Llama-3.2-1B" in msg and "`hf auth login`" in msg, msg
    assert "not in the Hugging Face cache" in msg and "\n" not in msg


def test_an_unknown_id_says_it_is_not_on_the_hub(hub: str) -> None:
    with pytest.raises(hub_source.ModelSourceError, match=r"facebook/musicgen-smal is not on the Hub .*check the id"):
        hub_source.cache_only("facebook/musicgen-smal")


def test_a_readable_model_is_left_to_transformers_and_asked_once(hub: str) -> None:
    HubAnswers.answers = {REPO_ID: (200, None)}
    assert hub_source.cache_only(REPO_ID) is False
    HubAnswers.answers = {}  # a second load in the same process does not ask again
    assert hub_source.cache_only(REPO_ID) is False


def test_an_unreachable_hub_falls_back_to_the_cache_with_a_note(
    hub: str, models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: refused at once
    with pytest.raises(hub_source.ModelSourceError, match=r"your machine cannot reach the Hub at http://127.0.0.1:9"):
        hub_source.cache_only(REPO_ID)
    put_in_cache(Path(constants.HF_HUB_CACHE), models["musicgen"], REPO_ID)
    monkeypatch.setattr(hub_source, "_decided", {})
    assert hub_source.cache_only(REPO_ID) is True
    assert f"reading {REPO_ID} from the Hugging Face cache" in capsys.readouterr().err


def test_what_is_not_the_hubs_answer_names_its_cause(
    hub: str, models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refused token and a proxy's page stop in one line (or read the cache); a 429 or 5xx with nothing cached is
    left to transformers, whose downloads retry those; a config alone in the cache is no cached model."""
    HubAnswers.answers = {"a/token": (401, "BadToken"), "a/portal": (200, "HTML"), REPO_ID: (429, None)}
    with pytest.raises(hub_source.ModelSourceError, match=r"refused your token \(Invalid credentials.*hf auth login"):
        hub_source.cache_only("a/token")
    with pytest.raises(hub_source.ModelSourceError, match=r"is not the Hub's \(a proxy or captive portal page\?\)"):
        hub_source.cache_only("a/portal")
    assert hub_source.cache_only(REPO_ID) is False and "answered 429" in capsys.readouterr().err
    config_only = Path(constants.HF_HUB_CACHE) / "config-only"
    config_only.mkdir(parents=True)
    shutil.copy(models["musicgen"] / "config.json", config_only)
    put_in_cache(Path(constants.HF_HUB_CACHE), config_only, "a/portal")
    monkeypatch.setattr(hub_source, "_decided", {})
    with pytest.raises(hub_source.ModelSourceError, match="not in the Hugging Face cache"):
        hub_source.cache_only("a/portal")


@pytest.mark.parametrize("name", ["C:\\models\\Llama-3.2-1B", "org/name@main", "my model/x"])
def test_a_name_that_is_neither_a_directory_nor_an_id_is_one_line(hub: str, name: str) -> None:
    with pytest.raises(OSError, match=r"is neither an existing directory nor a Hub id") as e:
        load_musicgen_decoder_config(name)
    assert "\n" not in str(e.value)


def test_offline_mode_never_asks_the_hub(hub: str, models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    HubAnswers.answers = {REPO_ID: (200, None)}  # it would be served: offline mode must not ask
    with pytest.raises(
        hub_source.ModelSourceError, match=r"offline mode \(HF_HUB_OFFLINE=1 or TRANSFORMERS_OFFLINE=1\)"
    ):
        hub_source.cache_only(REPO_ID)
    put_in_cache(Path(constants.HF_HUB_CACHE), models["musicgen"], REPO_ID)
    monkeypatch.setattr(hub_source, "_decided", {})
    assert hub_source.cache_only(REPO_ID) is True


def test_the_loaders_ask_first_and_a_local_directory_is_never_looked_up(hub: str, models: dict[str, Path]) -> None:
    with pytest.raises(OSError, match=r"MusicGen config: facebook/musicgen-smal is not on the Hub"):
        load_musicgen_decoder_config("facebook/musicgen-smal")
    assert load_musicgen_decoder_config(models["musicgen"]).num_codebooks == 4  # the stand-in Hub 404s every id


def _load_in_a_process(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full, text=True, capture_output=True)


@pytest.mark.budget(60, reason="two interpreters that import transformers")
def test_without_a_network_a_cached_model_loads_without_retries(models: dict[str, Path], tmp_path: Path) -> None:
    """What a user sees on a machine without internet: the trainer's command fails in one line at once when the model
    is not cached (before: five retries, ~23 s, each warning twice); a cached one loads from the cache."""
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "0"}
    code = f"from adapter_trainer.model.builders import load_musicgen_decoder as f; f({REPO_ID!r})"
    missing = _load_in_a_process(code, env)
    assert missing.returncode != 0 and "cannot reach the Hub at http://127.0.0.1:9" in missing.stderr
    assert "Retrying" not in missing.stderr, missing.stderr[-2000:]
    put_in_cache(tmp_path / "cache", models["musicgen"], REPO_ID)
    cached = _load_in_a_process(code, env)
    assert cached.returncode == 0, cached.stderr[-3000:]
    assert f"reading {REPO_ID} from the Hugging Face cache" in cached.stderr and "Retrying" not in cached.stderr


def test_a_missing_directory_under_an_existing_one_is_not_read_as_a_hub_id(
    hub: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`build/musicgen` before it is built: the directory is missing (one line), not a Hub repository named so."""
    in_a_folder_with_build(tmp_path, monkeypatch)
    with pytest.raises(OSError, match=r"MusicGen directory 'build/musicgen' does not exist"):
        load_musicgen_decoder_config("build/musicgen")


def test_rank_0s_answers_serve_every_rank_and_a_refusal_names_its_key(
    hub: str, models: dict[str, Path], shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """training.recipe: rank 0 asks (check_model_sources), the other ranks adopt its answers and ask nothing."""
    from adapter_trainer.config import ConfigError
    from adapter_trainer.model.builders import check_model_sources
    from tests.trainer.helpers import make_cfg

    HubAnswers.answers = {REPO_ID: (200, None)}
    check_model_sources(make_cfg(models, shards, tmp_path / "run", f"model.audio_lm={REPO_ID}").model)
    answers = hub_source.decisions()
    assert answers == {REPO_ID: False}  # the local LLM directory is never asked about
    monkeypatch.setattr(hub_source, "_decided", {})  # another rank
    HubAnswers.answers = {}  # the Hub would now say "not found": the adopted answer is used, no request made
    hub_source.adopt(answers)
    assert hub_source.cache_only(REPO_ID) is False
    with pytest.raises(ConfigError, match=r"^model\.audio_lm=facebook/musicgen-smal: facebook/musicgen-smal is not on"):
        check_model_sources(make_cfg(models, shards, tmp_path / "run", "model.audio_lm=facebook/musicgen-smal").model)

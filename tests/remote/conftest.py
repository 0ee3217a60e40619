"""Fixtures for the remote shard-set tests (servers in tests/remote/servers.py, all on 127.0.0.1):

- `s3_server` (session): moto's S3, started once; it sets no environment by itself.
- `s3_env` (function): the same server, reset to no buckets, with AWS_ENDPOINT_URL / AWS_ACCESS_KEY_ID /
  AWS_SECRET_ACCESS_KEY / AWS_DEFAULT_REGION in os.environ (so subprocesses inherit them) and the variables that
  would override them removed; s3fs's instance cache is cleared before and after, so no S3FileSystem made
  without these variables (or by an earlier test) is reused. Plain `fsspec.filesystem("s3")` reaches moto.
- `http_server` (function): a `FaultyHTTPServer` whose root is a fresh empty directory (`http_server.root`).
- `hub_server` (function): a `HubStandIn` that huggingface_hub talks to: HF_ENDPOINT, HF_TOKEN (dummy),
  HF_HUB_DISABLE_TELEMETRY=1, HF_HUB_DISABLE_XET=1 and HF_HOME / HF_HUB_CACHE / HF_XET_CACHE under tmp_path in
  os.environ (for subprocesses), and the module constants huggingface_hub read from them at import patched to match.
  HfApi / HfFileSystem made before the fixture keep the old endpoint: make them inside the test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.remote.servers import AWS_OVERRIDES, FaultyHTTPServer, HubStandIn, S3Server

# huggingface_hub variables that would win over (or disable) the ones hub_server sets
_HF_OVERRIDES = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HUGGINGFACE_CO_STAGING",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_OIDC_RESOURCE",
    "HF_TOKEN_PATH",
    "HUGGINGFACE_HUB_CACHE",
    "HF_ASSETS_CACHE",
)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture()
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    from s3fs import S3FileSystem

    s3_server.reset()
    for name in AWS_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)  # no profile of the developer's applies
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    S3FileSystem.clear_instance_cache()
    yield s3_server
    S3FileSystem.clear_instance_cache()


@pytest.fixture()
def http_server(tmp_path: Path) -> Iterator[FaultyHTTPServer]:
    root = tmp_path / "http_root"
    root.mkdir()
    with FaultyHTTPServer(root) as server:
        yield server


@pytest.fixture()
def hub_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubStandIn]:
    import huggingface_hub.constants as constants
    from huggingface_hub import HfFileSystem, hf_api, hf_file_system
    from huggingface_hub.utils import _cache_assets, _cache_manager, _http

    home = tmp_path / "hf_home"
    with HubStandIn() as hub:
        for name in _HF_OVERRIDES:
            monkeypatch.delenv(name, raising=False)
        for name, value in hub.env(home).items():
            monkeypatch.setenv(name, value)
        # read from the environment when huggingface_hub was imported
        patched = {
            "ENDPOINT": hub.url,
            "HUGGINGFACE_CO_URL_TEMPLATE": hub.url + "/{repo_id}/resolve/{revision}/{filename}",
            "HF_URL_HOSTS": constants.HF_URL_HOSTS | {"127.0.0.1"},
            "HF_HUB_OFFLINE": False,
            "HF_HUB_DISABLE_TELEMETRY": True,
            "HF_HUB_DISABLE_XET": True,
            "HF_HOME": str(home),
            "HF_HUB_CACHE": str(home / "hub"),
            "HUGGINGFACE_HUB_CACHE": str(home / "hub"),
            "HF_ASSETS_CACHE": str(home / "assets"),
            "HUGGINGFACE_ASSETS_CACHE": str(home / "assets"),
            "HF_XET_CACHE": str(home / "xet"),
            "HF_TOKEN_PATH": str(home / "token"),
            "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
            "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        }
        for name, value in patched.items():
            monkeypatch.setattr(constants, name, value)
        # copies of those constants made at import time
        monkeypatch.setattr(_cache_manager, "HF_HUB_CACHE", str(home / "hub"))
        monkeypatch.setattr(_cache_assets, "HF_ASSETS_CACHE", str(home / "assets"))
        monkeypatch.setattr(hf_api.api, "endpoint", hub.url)  # behind huggingface_hub.create_repo, upload_folder, ...
        hffs = hf_file_system.hffs  # the module-level HfFileSystem (huggingface_hub.hffs)
        monkeypatch.setattr(hffs, "endpoint", hub.url)
        monkeypatch.setattr(hffs._api, "endpoint", hub.url)
        monkeypatch.setattr(hffs, "dircache", {})
        monkeypatch.setattr(hffs, "_repo_and_revision_exists_cache", {})
        HfFileSystem.clear_instance_cache()
        yield hub
        HfFileSystem.clear_instance_cache()
        _http.close_session()  # drop pooled connections to this server

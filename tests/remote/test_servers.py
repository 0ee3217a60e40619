"""The loopback servers themselves, through the real client libraries: moto's S3 through plain fsspec/s3fs (the
environment alone points it there, subprocesses included), the faulty HTTP server through fsspec's HTTPFileSystem
(ranges, sizes, each fault as a client sees it), the Hub stand-in through HfFileSystem / HfApi (reads at a branch
and at a commit sha, pushes, a 503 on a resolve URL)."""

from __future__ import annotations

import hashlib
import http.client
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import fsspec
import pytest

from tests.remote.servers import FaultyHTTPServer, HubStandIn, S3Server

DATA = bytes(range(256)) * 40  # 10240 bytes, every offset distinguishable within 256
GITATTRIBUTES = b"*.tar filter=lfs diff=lfs merge=lfs -text\n"  # a new Hub repo's first commit holds it


def write_set(root: Path) -> dict[str, bytes]:
    """A tiny shard-set layout under `root`; returns {relative path: bytes}."""
    files = {"manifest.json": b'{"version": 1}', "train/shard-000000.tar": DATA, "eval/shard-000000.tar": DATA[:300]}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def get(server: FaultyHTTPServer, path: str, method: str = "GET", headers: dict | None = None):
    """One request on a fresh connection with http.client (no retries): (response, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1]), timeout=10)
    conn.request(method, "/" + path, headers=headers or {})
    r = conn.getresponse()
    return r, r.read()


# --- S3 ----------------------------------------------------------------------------------------------------------


def test_plain_fsspec_s3_reaches_moto_through_the_environment(s3_env: S3Server, tmp_path: Path) -> None:
    bucket = s3_env.make_bucket("shard-sets")
    with fsspec.open(f"{bucket}/set/manifest.json", "wb") as f:  # no endpoint, no credentials passed
        f.write(b'{"version": 1}')
    (tmp_path / "shard.tar").write_bytes(DATA)
    fs = fsspec.filesystem("s3")
    fs.put_file(str(tmp_path / "shard.tar"), "shard-sets/set/train/shard-000000.tar")

    body = s3_env.client().get_object(Bucket="shard-sets", Key="set/manifest.json")["Body"].read()
    assert body == b'{"version": 1}'  # read back with the endpoint passed explicitly: it landed in moto
    assert fs.info("shard-sets/set/train/shard-000000.tar")["size"] == len(DATA)
    assert fs.cat_file("shard-sets/set/train/shard-000000.tar", start=1000, end=1010) == DATA[1000:1010]
    assert fs.ls("shard-sets/set", detail=False) == ["shard-sets/set/manifest.json", "shard-sets/set/train"]


def test_upload_dir_and_a_subprocess_reads_with_the_inherited_environment(s3_env: S3Server, tmp_path: Path) -> None:
    assert s3_env.client().list_buckets()["Buckets"] == []  # reset: the previous test's bucket is gone
    files = write_set(tmp_path / "set")
    url = s3_env.make_bucket("sets-bucket") + "/runs/a"
    assert sorted(s3_env.upload_dir(tmp_path / "set", url)) == sorted(f"runs/a/{rel}" for rel in files)
    code = "import fsspec, sys; sys.stdout.buffer.write(fsspec.open(sys.argv[1]).open().read())"
    out = subprocess.run([sys.executable, "-c", code, f"{url}/train/shard-000000.tar"], capture_output=True, check=True)
    assert out.stdout == DATA
    with pytest.raises(ValueError, match="bucket name"):
        s3_env.make_bucket("ab")


# --- the faulty HTTP server --------------------------------------------------------------------------------------


def test_fsspec_http_reads_whole_files_ranges_and_sizes(http_server: FaultyHTTPServer, tmp_path: Path) -> None:
    write_set(http_server.root)
    fs = fsspec.filesystem("http")
    url = f"{http_server.url}/train/shard-000000.tar"

    assert fsspec.open(f"{http_server.url}/manifest.json").open().read() == b'{"version": 1}'
    assert fs.cat_file(url) == DATA
    assert fs.cat_file(url, start=100, end=110) == DATA[100:110]
    assert fs.cat_file(url, start=-4) == DATA[-4:]
    assert fs.info(url)["size"] == len(DATA)
    fs.get_file(url, str(tmp_path / "got.tar"))
    assert (tmp_path / "got.tar").read_bytes() == DATA
    with fs.open(url, "rb", block_size=1024) as f:
        f.seek(5000)
        assert f.read(100) == DATA[5000:5100]
        f.seek(9000)
        assert f.read() == DATA[9000:]

    log = http_server.requests
    assert {r.status for r in log} == {200, 206}
    assert ("GET", "train/shard-000000.tar", "bytes=100-109", 206) in log
    assert ("GET", "train/shard-000000.tar", "bytes=-4", 206) in log
    assert http_server.count("train/shard-000000.tar", "HEAD") >= 2  # info, open
    assert http_server.count("train/*", None) == http_server.count("train/shard-000000.tar", None) > 0


def test_range_requests_answer_206_416_or_the_whole_body(http_server: FaultyHTTPServer) -> None:
    (http_server.root / "ten.bin").write_bytes(b"0123456789")
    cases = {  # Range -> (body, Content-Range)
        "bytes=2-5": (b"2345", "bytes 2-5/10"),
        "bytes=7-": (b"789", "bytes 7-9/10"),
        "bytes=-3": (b"789", "bytes 7-9/10"),
        "bytes=8-99": (b"89", "bytes 8-9/10"),
    }
    for rng, (body, content_range) in cases.items():
        r, got = get(http_server, "ten.bin", headers={"Range": rng})
        assert (r.status, got, r.headers["Content-Range"]) == (206, body, content_range), rng
    r, got = get(http_server, "ten.bin", headers={"Range": "bytes=10-"})
    assert (r.status, r.headers["Content-Range"]) == (416, "bytes */10")
    r, got = get(http_server, "ten.bin", "HEAD")
    assert (r.status, r.headers["Content-Length"], r.headers["Accept-Ranges"], got) == (200, "10", "bytes", b"")
    assert get(http_server, "ten.bin")[1] == b"0123456789"
    assert get(http_server, "missing.bin")[0].status == 404
    assert get(http_server, "../outside", "GET")[0].status == 404
    assert get(http_server, "ten.bin", "POST")[0].status == 405


def test_fail_answers_the_status_to_the_next_n_matching_requests(http_server: FaultyHTTPServer) -> None:
    write_set(http_server.root)
    fs = fsspec.filesystem("http")
    http_server.fail("train/*", 429, times=2, retry_after=3)
    for _ in range(2):
        with pytest.raises(aiohttp.ClientResponseError) as e:
            fs.cat_file(f"{http_server.url}/train/shard-000000.tar")
        assert e.value.status == 429
    assert fs.cat_file(f"{http_server.url}/train/shard-000000.tar") == DATA  # spent
    http_server.fail("manifest.json", 503, retry_after=3)
    r, _ = get(http_server, "train/shard-000000.tar")
    assert r.status == 200  # another path is not hit
    r, _ = get(http_server, "manifest.json")
    assert (r.status, r.headers["Retry-After"]) == (503, "3")
    assert [r.status for r in http_server.requests] == [429, 429, 200, 200, 503]


def test_a_truncated_body_is_short_of_its_content_length(http_server: FaultyHTTPServer) -> None:
    write_set(http_server.root)
    url = f"{http_server.url}/train/shard-000000.tar"
    http_server.truncate("train/shard-000000.tar", 1000)
    with pytest.raises(aiohttp.ClientPayloadError):
        fsspec.filesystem("http").cat_file(url)
    http_server.truncate("train/shard-000000.tar", 1000)
    r, _ = get(http_server, "manifest.json")  # another path: whole
    with pytest.raises(http.client.IncompleteRead) as e:
        get(http_server, "train/shard-000000.tar")
    assert (len(e.value.partial), e.value.expected) == (1000, len(DATA) - 1000)
    assert get(http_server, "train/shard-000000.tar")[1] == DATA  # spent


def test_flip_changes_one_byte_where_a_body_holds_it(http_server: FaultyHTTPServer) -> None:
    write_set(http_server.root)
    http_server.flip("train/shard-000000.tar", offset=5000)
    assert get(http_server, "train/shard-000000.tar", headers={"Range": "bytes=0-99"})[1] == DATA[:100]  # not spent
    r, got = get(http_server, "train/shard-000000.tar", headers={"Range": "bytes=4990-5009"})
    assert r.status == 206 and got != DATA[4990:5010]
    assert [i for i in range(20) if got[i] != DATA[4990 + i]] == [10] and got[10] == DATA[5000] ^ 0xFF
    assert fsspec.filesystem("http").cat_file(f"{http_server.url}/train/shard-000000.tar") == DATA  # spent


def test_drop_hangs_up_without_an_answer(http_server: FaultyHTTPServer) -> None:
    write_set(http_server.root)
    http_server.drop("manifest.json")
    with pytest.raises(http.client.RemoteDisconnected):
        get(http_server, "manifest.json")
    # aiohttp retries an idempotent request once after a disconnect: one drop is invisible to fsspec, two are not
    fs = fsspec.filesystem("http")
    http_server.drop("manifest.json", times=1)
    assert fs.cat_file(f"{http_server.url}/manifest.json") == b'{"version": 1}'
    http_server.drop("manifest.json", times=2)
    with pytest.raises(aiohttp.ServerDisconnectedError):
        fs.cat_file(f"{http_server.url}/manifest.json")
    assert [r.status for r in http_server.requests] == [None, None, 200, None, None]


def test_delay_holds_the_answer(http_server: FaultyHTTPServer) -> None:
    write_set(http_server.root)
    http_server.delay("manifest.json", 0.4)
    t0 = time.monotonic()
    assert get(http_server, "manifest.json")[1] == b'{"version": 1}'
    assert time.monotonic() - t0 >= 0.4


def test_a_directory_answers_an_index_fsspec_lists(http_server: FaultyHTTPServer) -> None:
    write_set(http_server.root)
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    assert fs.ls(f"{http_server.url}/train", detail=False) == [f"{http_server.url}/train/shard-000000.tar"]
    assert sorted(fs.ls(f"{http_server.url}/", detail=False)) == [
        f"{http_server.url}/eval/",
        f"{http_server.url}/manifest.json",
        f"{http_server.url}/train/",
    ]


# --- the Hub stand-in --------------------------------------------------------------------------------------------


def test_hffs_reads_a_seeded_set_at_a_branch_and_at_a_commit_sha(hub_server: HubStandIn, tmp_path: Path) -> None:
    from huggingface_hub import HfApi, HfFileSystem

    files = write_set(tmp_path / "set")
    sha = hub_server.add_repo("owner/set", tmp_path / "set")
    fs = HfFileSystem()
    for rev in ("main", sha):
        root = f"datasets/owner/set@{rev}"
        assert fs.open(f"hf://{root}/manifest.json").read() == files["manifest.json"]
        assert fs.cat_file(f"{root}/train/shard-000000.tar", start=100, end=110) == DATA[100:110]
        assert fs.info(f"{root}/train/shard-000000.tar")["size"] == len(DATA)
        assert fs.resolve_path(f"{root}/manifest.json").revision == rev
        with fs.open(f"{root}/train/shard-000000.tar", "rb", block_size=1024) as f:
            f.seek(7000)
            assert f.read(50) == DATA[7000:7050]
    assert fs.ls("datasets/owner/set", detail=False) == [
        "datasets/owner/set/eval",
        "datasets/owner/set/train",
        "datasets/owner/set/.gitattributes",
        "datasets/owner/set/manifest.json",
    ]
    api = HfApi()
    assert api.dataset_info("owner/set", revision="main").sha == sha
    tree = {e.path: e for e in api.list_repo_tree("owner/set", repo_type="dataset", recursive=True, revision=sha)}
    assert tree["train/shard-000000.tar"].lfs.sha256 == hashlib.sha256(DATA).hexdigest()
    assert tree["eval/shard-000000.tar"].lfs.size == 300 and tree["manifest.json"].lfs is None
    infos = api.get_paths_info("owner/set", ["manifest.json", "train", "nope"], repo_type="dataset", revision=sha)
    assert [(i.path, type(i).__name__) for i in infos] == [("manifest.json", "RepoFile"), ("train", "RepoFolder")]
    assert any((r.range or "").startswith("bytes=7000-") and r.status == 206 for r in hub_server.requests)
    assert not [r for r in hub_server.requests if r.status is None or r.status >= 400]
    newer = hub_server.add_repo("owner/set", {"manifest.json": b"{}"})
    assert hub_server.commits("owner/set")[:2] == [newer, sha]
    assert hub_server.files("owner/set", sha) == {**files, ".gitattributes": GITATTRIBUTES}  # the old tree is kept
    assert fs.cat_file(f"datasets/owner/set@{newer}/manifest.json") == b"{}"


def test_a_push_makes_a_new_commit_and_the_old_one_stays_readable(hub_server: HubStandIn, tmp_path: Path) -> None:
    from huggingface_hub import CommitOperationAdd, HfApi, HfFileSystem

    files = write_set(tmp_path / "set")
    api = HfApi()
    for _ in range(2):
        assert api.create_repo("me/pushed", repo_type="dataset", exist_ok=True).repo_id == "me/pushed"
    first = api.upload_folder(folder_path=tmp_path / "set", repo_id="me/pushed", repo_type="dataset").oid
    assert hub_server.files("me/pushed") == {**files, ".gitattributes": GITATTRIBUTES}
    ops = [CommitOperationAdd("manifest.json", b'{"version": 2}')]
    second = api.create_commit("me/pushed", ops, commit_message="v2", repo_type="dataset").oid

    assert hub_server.commits("me/pushed")[:2] == [second, first] and len(hub_server.commits("me/pushed")) == 3
    fs = HfFileSystem()
    assert fs.cat_file(f"datasets/me/pushed@{first}/manifest.json") == b'{"version": 1}'
    assert fs.cat_file(f"datasets/me/pushed@{second}/manifest.json") == b'{"version": 2}'
    assert fs.cat_file("datasets/me/pushed@main/manifest.json") == b'{"version": 2}'
    assert fs.cat_file(f"datasets/me/pushed@{second}/train/shard-000000.tar") == DATA
    assert api.dataset_info("me/pushed", revision=first).sha == first
    assert api.dataset_info("me/pushed").sha == second


def test_hub_faults_and_refusals_reach_the_client(hub_server: HubStandIn) -> None:
    from huggingface_hub import HfApi, HfFileSystem
    from huggingface_hub.errors import HfHubHTTPError

    hub_server.add_repo("owner/set", {"manifest.json": b"{}"})
    hub_server.fail("datasets/owner/set/resolve/*/manifest.json", 503)
    assert HfFileSystem().cat_file("datasets/owner/set/manifest.json") == b"{}"  # huggingface_hub retries (1 s)
    statuses = [r.status for r in hub_server.requests if r.path.endswith("resolve/main/manifest.json")]
    assert statuses == [503, 200]
    with pytest.raises(FileNotFoundError):
        HfFileSystem().cat_file("datasets/owner/set/missing.json")
    with pytest.raises(HfHubHTTPError) as e:
        HfApi(token=False).create_repo("owner/other", repo_type="dataset")  # writes need the token
    assert e.value.response.status_code == 401


def test_a_subprocess_reaches_the_hub_stand_in_through_the_environment(hub_server: HubStandIn) -> None:
    hub_server.add_repo("owner/set", {"manifest.json": b'{"sub": 1}'})
    code = "import sys; from huggingface_hub import HfFileSystem; sys.stdout.buffer.write(HfFileSystem().cat_file(sys.argv[1]))"
    out = subprocess.run(
        [sys.executable, "-c", code, "datasets/owner/set@main/manifest.json"],
        capture_output=True,
        check=True,
    )
    assert out.stdout == b'{"sub": 1}'

"""Inputs a review threw at remote sets, each a regression test: servers that stream chunked bodies without
Content-Length or ignore Range requests, a body cut off mid-transfer, an origin file shorter than the manifest says, a
download left by a killed process while others run, URL forms (file:// with escapes or localhost, query strings, Hub
refs), Retry-After as a date or negative, and a worker's error reaching the command line as one line."""

from __future__ import annotations

import hashlib
import os
import threading
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from adapter_trainer.data.remote import urls
from adapter_trainer.data.remote.cache import BOOKKEEPING_BYTES, RemoteShard, ShardCache, ShardCacheError
from adapter_trainer.data.remote.retry import retry_after_s
from adapter_trainer.errors import UserError, one_line
from tests.remote.servers import FaultyHTTPServer

BIG = 3 * 1024 * 1024  # several of fsspec's default 5 MiB blocks would be one; streamed reads need no Range


class _Quiet:
    def log_message(self, *args) -> None:
        pass


def serve(handler: type, root: Path):
    """A stdlib server for `root` on 127.0.0.1 in a daemon thread; (server, base URL)."""

    class H(_Quiet, handler):  # type: ignore[misc, valid-type]
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, directory=str(root), **kw)

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address) -> None:  # a client that hangs up early (the cut, a read ahead)
            pass

    httpd = Server(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture()
def big_file(tmp_path: Path) -> tuple[Path, RemoteShard]:
    root = tmp_path / "srv"
    root.mkdir()
    data = os.urandom(BIG)
    (root / "big.tar").write_bytes(data)
    return root, RemoteShard("", hashlib.sha256(data).hexdigest(), BIG, "train/big.tar")


def test_a_server_that_ignores_range_requests_serves_whole_shards(big_file, tmp_path) -> None:
    root, shard = big_file
    httpd, url = serve(SimpleHTTPRequestHandler, root)  # python -m http.server: no Range support
    try:
        cache = ShardCache(tmp_path / "c")
        cache.fetch(RemoteShard(f"{url}/big.tar", shard.sha256, shard.bytes), what="shard train/big.tar")
        assert hashlib.sha256(cache.path(shard.sha256).read_bytes()).hexdigest() == shard.sha256
    finally:
        httpd.shutdown()


class ChunkedCutOnce(BaseHTTPRequestHandler):
    """Bodies sent chunked (no Content-Length); the first GET of the run is cut after 1.5 MiB."""

    protocol_version = "HTTP/1.1"
    gets = 0

    def __init__(self, *a, directory: str, **kw) -> None:
        self.directory = directory
        super().__init__(*a, **kw)

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def do_GET(self) -> None:
        data = (Path(self.directory) / self.path.lstrip("/")).read_bytes()
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        ChunkedCutOnce.gets += 1
        end = 1536 * 1024 if ChunkedCutOnce.gets == 1 else len(data)
        for i in range(0, end, 4096):
            part = data[i : min(i + 4096, end)]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        if end < len(data):
            self.wfile.flush()
            self.close_connection = True  # cut: no last chunk
            return
        self.wfile.write(b"0\r\n\r\n")


def test_a_chunked_body_cut_off_is_read_again_from_the_start(big_file, tmp_path) -> None:
    root, shard = big_file
    ChunkedCutOnce.gets = 0
    httpd, url = serve(ChunkedCutOnce, root)
    try:
        cache = ShardCache(tmp_path / "c", tries=3)
        cache.fetch(RemoteShard(f"{url}/big.tar", shard.sha256, shard.bytes), what="shard train/big.tar")
        assert hashlib.sha256(cache.path(shard.sha256).read_bytes()).hexdigest() == shard.sha256
        assert ChunkedCutOnce.gets == 2  # the cut GET, then one whole one (a streamed body cannot seek)
    finally:
        httpd.shutdown()


def test_an_origin_file_shorter_than_the_manifest_is_refused_as_corrupt_not_retried(tmp_path) -> None:
    root = tmp_path / "srv"
    root.mkdir()
    data = os.urandom(10_240)
    (root / "s.tar").write_bytes(data[:5_000])  # the origin's copy is truncated; the manifest lists 10,240 bytes
    with FaultyHTTPServer(root) as srv:
        cache = ShardCache(tmp_path / "c", tries=5)
        shard = RemoteShard(srv.url_of("s.tar"), hashlib.sha256(data).hexdigest(), 10_240, "train/s.tar")
        with pytest.raises(ShardCacheError, match=r"has sha256 <5000 bytes, not 10240>.*fetched twice"):
            cache.fetch(shard, what="shard train/s.tar")
        assert srv.count("*s.tar") == 2  # fetched once more, not retried as a network failure


def test_a_download_left_by_a_killed_process_is_reclaimed_by_a_running_one(tmp_path) -> None:
    root = tmp_path / "srv"
    root.mkdir()
    data = os.urandom(10_240)
    (root / "s.tar").write_bytes(data)
    with FaultyHTTPServer(root) as srv:
        cache = ShardCache(tmp_path / "c", max_bytes=10_240 + BOOKKEEPING_BYTES, wait_s=5)  # room for one tar
        cache._ready()  # this process opened the cache before the other one died
        sha = hashlib.sha256(data).hexdigest()
        dead = ("e" if sha.startswith("d") else "d") * 64  # a shard of another lock stripe than the one fetched
        (tmp_path / "c" / f"{dead}-10240.99999.0.part").write_bytes(b"x")  # its download, lock free: dead
        cache.fetch(RemoteShard(srv.url_of("s.tar"), sha, 10_240), what="s")
        assert not list((tmp_path / "c").glob("*.part"))


def test_url_forms() -> None:
    assert urls.local_path("file:///tmp/my%20set") == "/tmp/my set"
    assert urls.local_path("file://localhost/tmp/x") == "/tmp/x"
    with pytest.raises(UserError, match="file:///path"):
        urls.local_path("file://otherhost/tmp/x")
    assert urls.join("https://h/p/set?token=abc", "train/a.tar") == "https://h/p/set/train/a.tar?token=abc"
    assert urls.join("s3://b/set/", "manifest.json") == "s3://b/set/manifest.json"
    m = urls._HF_DATASET.match("hf://datasets/o/n@refs/pr/1/sub")
    assert m and (m.group("rev"), m.group("path")) == ("refs/pr/1", "/sub")
    m = urls._HF_DATASET.match("hf://datasets/o/n@feat%2fx")
    assert m and m.group("rev") == "feat%2fx" and m.group("path") is None
    sha = "a" * 40
    assert urls.pin(f"hf://datasets/o/n@{sha}/x") == f"hf://datasets/o/n@{sha}/x"  # a commit needs no lookup


def test_retry_after_as_a_date_or_negative() -> None:
    class Busy(Exception):
        def __init__(self, value: str) -> None:
            self.status, self.headers = 429, {"Retry-After": value}

    assert retry_after_s(Busy("-3")) == 0.0
    assert retry_after_s(Busy("Wed, 21 Oct 2015 07:28:00 GMT")) == 0.0  # in the past
    from datetime import datetime, timedelta, timezone
    from email.utils import format_datetime

    later = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    assert 20 < retry_after_s(Busy(later)) <= 30


def test_a_workers_error_is_one_line() -> None:
    """torch re-makes a DataLoader worker's exception with the worker's whole traceback as its message."""
    wrapped = ShardCacheError(
        "Caught ShardCacheError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n    raise ShardCacheError(msg)\n'
        "adapter_trainer.data.remote.cache.ShardCacheError: shard train/a.tar: s3://b/a.tar has sha256 x\n"
    )
    assert one_line(wrapped) == "shard train/a.tar: s3://b/a.tar has sha256 x"
    assert one_line(ShardCacheError("plain")) == "plain"


def test_a_manifest_sha256_that_is_not_hex_is_refused_before_it_names_a_cache_file(tmp_path) -> None:
    """The sha256 names the cache's files: '../x' there must never become a path outside the cache."""
    import json

    from adapter_trainer.data.shards import ShardFormatError, read_manifest
    from tests.contract.shard_fixture import write_synthetic_set

    root = write_synthetic_set(tmp_path / "set", n_train=4, n_eval=2, frames=(12, 16), samples_per_shard=4)
    m = json.loads((root / "manifest.json").read_text())
    m["splits"]["train"]["shards"][0]["sha256"] = "../../escaped"
    (root / "manifest.json").write_text(json.dumps(m))
    with FaultyHTTPServer(root) as srv:
        for where in (str(root), srv.url):
            with pytest.raises(ShardFormatError, match=r"sha256='\.\./\.\./escaped'.*64 lowercase hex"):
                read_manifest(where, ShardCache(tmp_path / "cache"))
    assert not (tmp_path / "escaped").exists()

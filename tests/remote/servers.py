"""Loopback servers for the remote shard-set tests and benchmark, each on 127.0.0.1 at an ephemeral port:

- `S3Server`: moto's S3 in server mode. A real HTTP endpoint, so s3fs with no extra kwargs, DataLoader workers and
  torchrun ranks reach it through the environment (`S3Server.env`: AWS_ENDPOINT_URL and test credentials).
- `FaultyHTTPServer`: the files under a root, GET/HEAD with Range requests, for fsspec's HTTPFileSystem, plus
  faults on demand: a status (429, 503, ...), a body cut short, a flipped byte, a dropped connection, a delay.
- `HubStandIn`: just enough of the Hugging Face Hub's HTTP API (read from huggingface_hub 2.4.0) for HfFileSystem
  reads at a branch or a commit sha, HfApi's info / tree / paths-info / commits, and create_repo + create_commit /
  upload_folder pushes; every commit is kept, so old revisions stay readable. Same faults as `FaultyHTTPServer`.

Why hand-written servers: no library serves faults on demand over real sockets (patching the client would bypass the
very code under test: retries, Range reads, size checks), and there is no offline Hub. They follow
tests/pipeline/media_server.py: a `ThreadingHTTPServer` in a daemon thread, used as a context manager.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import hashlib
import json
import logging
import mimetypes
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

CHUNK = 64 * 1024  # bytes per socket write


class Request(NamedTuple):
    """One request as a server saw it (appended once answered)."""

    method: str
    path: str  # the URL path, percent-decoded, without its leading "/" and query
    range: str | None  # the Range header as sent
    status: int | None  # None: the connection was dropped without a response


@dataclass
class _Fault:
    kind: str  # "fail" | "truncate" | "flip" | "drop" | "delay"
    pattern: str  # an exact path or an fnmatch glob, matched against `Request.path`
    times: int  # requests left to hit
    status: int = 0
    retry_after: float | None = None
    n_bytes: int = 0
    offset: int = 0
    seconds: float = 0.0


class _Unsatisfiable(Exception):
    pass


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """`(first, stop)` of a single `bytes=a-b`, `bytes=a-` or `bytes=-n` range of a `size`-byte body, clipped to it;
    None for no header or one this server ignores (several ranges, `b < a`), which RFC 9110 answers with the whole
    body. Raises `_Unsatisfiable` (answered 416) for a range starting past the end."""
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if m is None or not (m[1] or m[2]):
        return None
    if not m[1]:  # the last n bytes
        n = int(m[2])
        if n == 0:
            raise _Unsatisfiable
        return max(size - n, 0), size
    first = int(m[1])
    if m[2] and int(m[2]) < first:
        return None
    if first >= size:
        raise _Unsatisfiable
    return first, min(int(m[2]) + 1, size) if m[2] else size


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # HfFileSystem lists sub-trees with up to 16 parallel requests

    def __init__(self, owner: _LoopbackServer) -> None:
        self.owner = owner
        self.open_sockets: set[socket.socket] = set()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request, client_address) -> None:
        with self.owner._lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self.owner._lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:  # clients hang up early on purpose (faults, probes)
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as clients pool connections
    server: _HTTPServer
    entry: tuple[str, str, str | None] = ("", "", None)  # (method, path, Range) of the request being answered
    logged = True  # until `_serve` starts one: the 400 for a malformed request line is not logged

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def send_response(self, code: int, message: str | None = None) -> None:
        self._log(code)  # before the status line goes out: a client never sees an answer the log lacks
        super().send_response(code, message)

    def _log(self, status: int | None) -> None:
        if not self.logged:
            self.logged = True
            self.server.owner._log(Request(*self.entry, status))

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        owner = self.server.owner
        body = self._read_body()  # always, so a fault leaves the connection in step
        path = unquote(urlsplit(self.path).path).lstrip("/")
        self.entry, self.logged = (method, path, self.headers.get("Range")), False
        try:
            if (fault := owner._take("delay", path, method)) is not None:
                time.sleep(fault.seconds)
            if owner._take("drop", path, method) is not None:
                self._log(None)
                self.close_connection = True  # hang up without a status line
                return
            if (fault := owner._take("fail", path, method)) is not None:
                headers = {} if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
                msg = f"injected {fault.status} for {path}"
                return self.reply(fault.status, method, json.dumps({"error": msg}).encode(), headers=headers)
            owner._handle(self, method, path, body)
        finally:
            self._log(None)  # no-op once answered; None when the handler failed before a status line

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while n := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                out += self.rfile.read(n)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return bytes(out)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(
        self,
        status: int,
        method: str,
        body: bytes = b"",
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """A complete response; HEAD gets the headers only."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(body)

    def reply_json(self, status: int, method: str, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        self.reply(status, method, json.dumps(payload).encode(), headers=headers)


class _LoopbackServer:
    """A `ThreadingHTTPServer` on 127.0.0.1:<ephemeral> in a daemon thread, with a request log and faults on demand.
    Thread-safe: faults may be added while a client is reading."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._faults: list[_Fault] = []
        self._requests: list[Request] = []
        self._httpd = _HTTPServer(self)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`, no trailing slash."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> _LoopbackServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and hang up kept-alive connections (their handler threads end)."""
        self._httpd.shutdown()
        with self._lock:
            sockets = list(self._httpd.open_sockets)
        for s in sockets:
            with contextlib.suppress(OSError):  # already closed by the client
                s.shutdown(socket.SHUT_RDWR)
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # the request log

    @property
    def requests(self) -> list[Request]:
        """Every answered (or dropped) request so far, in order: `(method, path, range, status)`."""
        with self._lock:
            return list(self._requests)

    def count(self, path: str, method: str | None = "GET") -> int:
        """Requests whose path is `path` (or matches it as a glob), of `method` (None: any)."""
        return sum(1 for r in self.requests if _matches(r.path, path) and method in (None, r.method))

    def clear_log(self) -> None:
        with self._lock:
            self._requests.clear()

    def _log(self, request: Request) -> None:
        with self._lock:
            self._requests.append(request)

    # faults: each hits the next `times` requests whose path matches (an exact path or an fnmatch glob)

    def fail(self, path: str, status: int, times: int = 1, retry_after: float | None = None) -> None:
        """Answer `status` (e.g. 429, 500, 503), with `Retry-After` when given, instead of the resource."""
        self._add(_Fault("fail", path, times, status=status, retry_after=retry_after))

    def truncate(self, path: str, n_bytes: int, times: int = 1) -> None:
        """GET: announce the full Content-Length, send only the body's first `n_bytes`, then close."""
        self._add(_Fault("truncate", path, times, n_bytes=n_bytes))

    def flip(self, path: str, offset: int, times: int = 1) -> None:
        """GET: XOR 0xFF the byte at file offset `offset`; spent only by responses whose body holds that byte."""
        self._add(_Fault("flip", path, times, offset=offset))

    def drop(self, path: str, times: int = 1) -> None:
        """Close the connection without answering."""
        self._add(_Fault("drop", path, times))

    def delay(self, path: str, seconds: float, times: int = 1) -> None:
        """Wait `seconds` before answering (then any other fault applies)."""
        self._add(_Fault("delay", path, times, seconds=seconds))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _add(self, fault: _Fault) -> None:
        fault.pattern = fault.pattern.lstrip("/")
        with self._lock:
            self._faults.append(fault)

    def _take(
        self, kind: str, path: str, method: str, applies: Callable[[_Fault], bool] | None = None
    ) -> _Fault | None:
        """Spend one hit of the first matching fault of `kind`; truncate and flip only hit GETs."""
        if kind in ("truncate", "flip") and method != "GET":
            return None
        with self._lock:
            for f in self._faults:
                if f.kind == kind and f.times > 0 and _matches(path, f.pattern) and (applies is None or applies(f)):
                    f.times -= 1
                    return f
        return None

    # serving

    def _handle(self, h: _Handler, method: str, path: str, body: bytes) -> None:
        raise NotImplementedError

    def _send_ranged(
        self,
        h: _Handler,
        method: str,
        path: str,
        size: int,
        read: Callable[[int, int], bytes],
        content_type: str = "application/octet-stream",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """200 with the whole body, or 206 for a Range (416 past the end), `read(a, b)` giving bytes [a, b);
        applies the truncate and flip faults."""
        try:
            span = parse_range(h.headers.get("Range"), size)
        except _Unsatisfiable:
            return h.reply(416, method, headers={"Content-Range": f"bytes */{size}"})
        first, stop = span or (0, size)
        h.send_response(206 if span else 200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(stop - first))
        h.send_header("Accept-Ranges", "bytes")
        if span:
            h.send_header("Content-Range", f"bytes {first}-{stop - 1}/{size}")
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if method == "HEAD":
            return
        cut = self._take("truncate", path, method)
        end = stop if cut is None else min(stop, first + cut.n_bytes)
        flip = self._take("flip", path, method, applies=lambda f: first <= f.offset < end)
        for a in range(first, end, CHUNK):
            chunk = read(a, min(a + CHUNK, end))
            if flip is not None and a <= flip.offset < a + len(chunk):
                chunk = bytearray(chunk)
                chunk[flip.offset - a] ^= 0xFF
            try:
                h.wfile.write(chunk)
            except OSError:  # the client hung up
                h.close_connection = True
                return
        if end < stop:
            h.close_connection = True  # the announced length never comes: the client sees a short body


def _matches(path: str, pattern: str) -> bool:
    pattern = pattern.lstrip("/")
    return path == pattern or fnmatch.fnmatchcase(path, pattern)


# --- a static HTTP file server with faults ---------------------------------------------------------------------


class FaultyHTTPServer(_LoopbackServer):
    """Serves the files under `root` at `url` (`<url>/<relative path>`): GET and HEAD with Content-Length,
    `Accept-Ranges: bytes`, single Range requests (206 + Content-Range, 416 past the end) and an ETag; a directory
    answers a plain HTML index of links (what fsspec's HTTP `ls` parses). Other methods get 405."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        super().__init__()

    def start(self) -> FaultyHTTPServer:
        super().start()
        return self

    def url_of(self, rel: str) -> str:
        return f"{self.url}/{quote(rel.lstrip('/'))}"

    def _handle(self, h: _Handler, method: str, path: str, body: bytes) -> None:
        if method not in ("GET", "HEAD"):
            return h.reply(405, method, headers={"Allow": "GET, HEAD"})
        target = (self.root / path).resolve()
        if not target.is_relative_to(self.root) or not target.exists():
            return h.reply(404, method, b"not found", "text/plain")
        if target.is_dir():
            return h.reply(200, method, self._index(target), "text/html; charset=utf-8")
        stat = target.stat()
        content_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        etag = {"ETag": f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'}
        with target.open("rb") as f:

            def read(a: int, b: int) -> bytes:
                f.seek(a)
                return f.read(b - a)

            self._send_ranged(h, method, path, stat.st_size, read, content_type, etag)

    def _index(self, directory: Path) -> bytes:
        links = []
        for p in sorted(directory.iterdir()):
            rel = p.relative_to(self.root).as_posix() + ("/" if p.is_dir() else "")
            links.append(f'<a href="/{quote(rel)}">{escape(p.name)}{"/" if p.is_dir() else ""}</a>')
        return ("<html><body>\n" + "<br>\n".join(links) + "\n</body></html>\n").encode()


# --- moto's S3 in server mode ----------------------------------------------------------------------------------


# AWS variables that would win over (or disable) the endpoint and credentials in `S3Server.env`: a client meant for
# the loopback server runs without them (tests/remote/conftest.py's s3_env, benchmarks/bench_remote.py)
AWS_OVERRIDES = (
    "AWS_ENDPOINT_URL_S3",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_REGION",
)


class S3Server:
    """moto's S3 (`ThreadedMotoServer`, flask + moto[s3] suffice) on 127.0.0.1:<ephemeral>. `env` is what a client
    needs (set it in os.environ: plain `fsspec.filesystem("s3")`, boto3, subprocesses and torchrun ranks all read
    it); the helpers below pass the endpoint explicitly, so they never depend on the environment under test."""

    ACCESS_KEY = "testing"
    SECRET_KEY = "testing"
    REGION = "us-east-1"  # buckets need no LocationConstraint

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        # werkzeug logs one INFO line per request through the "werkzeug" logger: keep errors only
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._endpoint: str | None = None

    def start(self) -> S3Server:
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self._endpoint = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self._moto.stop()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def endpoint_url(self) -> str:
        assert self._endpoint is not None, "start() first"
        return self._endpoint

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables that point any AWS SDK client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": self.SECRET_KEY,
            "AWS_DEFAULT_REGION": self.REGION,
        }

    def client(self) -> Any:
        """A boto3 S3 client with the endpoint and credentials passed explicitly."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.ACCESS_KEY,
            aws_secret_access_key=self.SECRET_KEY,
            region_name=self.REGION,
        )

    def reset(self) -> None:
        """Forget every bucket (moto's reset API)."""
        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()

    def make_bucket(self, name: str) -> str:
        """Create bucket `name` (3-63 characters: lowercase letters, digits, dots, hyphens) -> `s3://name`."""
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", name):
            raise ValueError(f"invalid S3 bucket name {name!r} (3-63 of a-z 0-9 . -)")
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def upload_dir(self, local_dir: Path, url: str) -> list[str]:
        """Upload every file under `local_dir` to `s3://bucket/prefix/<relative path>`; returns the keys."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        client, keys = self.client(), []
        for p in sorted(Path(local_dir).rglob("*")):
            if p.is_file():
                key = "/".join(s for s in (prefix.strip("/"), p.relative_to(local_dir).as_posix()) if s)
                client.upload_file(str(p), bucket, key)
                keys.append(key)
        return keys


# --- a Hugging Face Hub stand-in -------------------------------------------------------------------------------

TOKEN = "hf_standin_dummy_token"
_TYPES = {"datasets": "dataset", "models": "model", "spaces": "space"}
_PREFIX = {"dataset": "datasets/", "space": "spaces/", "model": ""}


@dataclass(frozen=True)
class _Blob:
    data: bytes
    git_oid: str  # the git blob sha1 (of the LFS pointer for an LFS file, as on the Hub)
    sha256: str
    lfs: bool
    pointer_size: int


@dataclass
class _Commit:
    sha: str
    parent: str | None
    title: str
    message: str
    date: str
    files: dict[str, _Blob]  # the whole tree; blobs are shared between commits (copy-on-write)


@dataclass
class _Repo:
    repo_type: str
    repo_id: str
    created: str
    commits: dict[str, _Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _flag(values: list[str] | None) -> bool:
    return bool(values) and values[0].lower() in ("1", "true")


class HubStandIn(_LoopbackServer):
    """The Hub's HTTP API for model/dataset/space repos, enough for huggingface_hub 2.4.0's HfFileSystem and HfApi:

        GET  /api/{type}s/{repo}[/revision/{rev}]       info: sha of the revision, siblings (`?blobs=1`: sizes, lfs)
        GET  /api/{type}s/{repo}/tree/{rev}[/{path}]    list_repo_tree, HfFileSystem.ls/info (`recursive`, `expand`)
        POST /api/{type}s/{repo}/paths-info/{rev}       get_paths_info (form or JSON `paths`, `expand`)
        GET  /api/{type}s/{repo}/commits/{rev}          list_repo_commits, newest first
        GET  /api/{type}s/{repo}/refs                   list_repo_refs
        POST /api/{type}s/{repo}/branch/{branch}        create_branch (`startingPoint`)
        POST /api/repos/create                          create_repo (409 when it exists: `exist_ok` handles it)
        POST /api/{type}s/{repo}/preupload/{rev}        every file "regular", with the oid of the file already there
        POST /api/{type}s/{repo}/commit/{branch}        NDJSON: file (base64) / deletedFile / deletedFolder /
                                                        lfsFile (a blob already stored, by sha256); parentCommit 412
        GET|HEAD /[datasets/|spaces/]{repo}/resolve/{rev}/{path}   the bytes, Range reads, ETag, X-Repo-Commit,
                                                        X-Linked-Size/-Etag for LFS files
        POST /api/validate-yaml, GET /api/whoami-v2, GET /api/agent-harnesses   answered so nothing else fails

    A revision is a branch, a full commit sha or a unique prefix of 7+ hex digits. Errors carry the Hub's
    X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound), which huggingface_hub maps to its exceptions.
    Writes (POST) need `Authorization: Bearer <token>` (401 otherwise, like the Hub refusing anonymous pushes);
    reads are open. Files matching `lfs_patterns` are listed as LFS (`lfs: {oid: sha256, size, pointerSize}`), as the
    Hub stores tars; their bytes still travel inline in the commit (upload mode "regular", so no LFS/Xet endpoints).
    A new repo starts, as on the Hub, with one commit holding `.gitattributes`.
    """

    def __init__(self, token: str | None = TOKEN, lfs_patterns: tuple[str, ...] = ("*.tar",)) -> None:
        self.token = token
        self.lfs_patterns = lfs_patterns
        self._repos: dict[tuple[str, str], _Repo] = {}
        self._by_sha256: dict[str, _Blob] = {}
        self._n_commits = 0
        super().__init__()

    def start(self) -> HubStandIn:
        super().start()
        return self

    def env(self, home: Path) -> dict[str, str]:
        """Environment for a process (set before huggingface_hub is imported) that points it here, with its caches
        under `home`."""
        return {
            "HF_ENDPOINT": self.url,
            "HF_TOKEN": self.token or "",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_XET": "1",
            "HF_HOME": str(home),
            "HF_HUB_CACHE": str(Path(home) / "hub"),
            "HF_XET_CACHE": str(Path(home) / "xet"),
        }

    # helpers for tests

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes] | Path,
        branch: str = "main",
        repo_type: str = "dataset",
        message: str = "Seed files",
    ) -> str:
        """Commit `files` ({path: bytes}, or every file under a directory) on top of `branch`, creating the repo
        and the branch (from main) when missing; returns the new commit sha."""
        if isinstance(files, Path):
            files = {p.relative_to(files).as_posix(): p.read_bytes() for p in sorted(files.rglob("*")) if p.is_file()}
        with self._lock:
            repo = self._repos.get((repo_type, repo_id)) or self._create(repo_type, repo_id)
            if branch not in repo.branches:
                repo.branches[branch] = repo.branches["main"]
            tree = dict(repo.commits[repo.branches[branch]].files)
            tree.update({p: self._blob(p, data) for p, data in files.items()})
            return self._commit(repo, branch, tree, message, "", json.dumps(sorted(files)).encode()).sha

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "dataset") -> dict[str, bytes]:
        """{path: bytes} of the repo at `revision` (a branch or a commit sha)."""
        with self._lock:
            repo = self._repos[(repo_type, repo_id)]
            commit = self._resolve(repo, revision)
            if commit is None:
                raise KeyError(f"{repo_id}@{revision}")
            return {p: b.data for p, b in commit.files.items()}

    def commits(self, repo_id: str, revision: str = "main", repo_type: str = "dataset") -> list[str]:
        """Commit shas reachable from `revision`, newest first (the last one is the repo's initial commit)."""
        with self._lock:
            repo = self._repos[(repo_type, repo_id)]
            return [c.sha for c in self._history(repo, self._resolve(repo, revision))]

    # state (callers hold the lock)

    def _blob(self, path: str, data: bytes) -> _Blob:
        sha256 = hashlib.sha256(data).hexdigest()
        lfs = any(fnmatch.fnmatchcase(path, p) for p in self.lfs_patterns)
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n".encode()
        blob = _Blob(data, _git_oid(pointer if lfs else data), sha256, lfs, len(pointer))
        self._by_sha256.setdefault(sha256, blob)
        return blob

    def _create(self, repo_type: str, repo_id: str) -> _Repo:
        repo = self._repos[(repo_type, repo_id)] = _Repo(repo_type, repo_id, _now())
        attrs = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in self.lfs_patterns).encode()
        self._commit(repo, "main", {".gitattributes": self._blob(".gitattributes", attrs)}, "initial commit", "", b"")
        return repo

    def _commit(self, repo: _Repo, branch: str, files: dict[str, _Blob], title: str, message: str, seed: bytes):
        parent = repo.branches.get(branch)
        self._n_commits += 1
        sha = hashlib.sha1(f"{parent}\n{self._n_commits}\n".encode() + seed).hexdigest()
        commit = repo.commits[sha] = _Commit(sha, parent, title, message, _now(), files)
        repo.branches[branch] = sha
        return commit

    def _resolve(self, repo: _Repo, revision: str | None) -> _Commit | None:
        revision = revision or "main"
        if revision in repo.branches:
            return repo.commits[repo.branches[revision]]
        if revision in repo.commits:
            return repo.commits[revision]
        if re.fullmatch(r"[0-9a-f]{7,39}", revision):
            hits = [c for sha, c in repo.commits.items() if sha.startswith(revision)]
            return hits[0] if len(hits) == 1 else None
        return None

    def _history(self, repo: _Repo, commit: _Commit | None) -> Iterator[_Commit]:
        while commit is not None:
            yield commit
            commit = repo.commits[commit.parent] if commit.parent else None

    def _url(self, repo: _Repo) -> str:
        return f"{self.url}/{_PREFIX[repo.repo_type]}{repo.repo_id}"

    # listing

    @staticmethod
    def _dirs(commit: _Commit) -> set[str]:
        return {"/".join(p.split("/")[:i]) for p in commit.files for i in range(1, p.count("/") + 1)}

    def _entry(self, repo: _Repo, commit: _Commit, path: str, expand: bool) -> dict[str, Any]:
        if path in commit.files:
            blob = commit.files[path]
            out: dict[str, Any] = {"type": "file", "oid": blob.git_oid, "size": len(blob.data), "path": path}
            if blob.lfs:
                out["lfs"] = {"oid": blob.sha256, "size": len(blob.data), "pointerSize": blob.pointer_size}
        else:
            under = sorted((p, b.git_oid) for p, b in commit.files.items() if p.startswith(path + "/"))
            out = {"type": "directory", "oid": hashlib.sha1(repr(under).encode()).hexdigest(), "size": 0, "path": path}
        if expand:
            last = self._last_change(repo, commit, path)
            out["lastCommit"] = {"id": last.sha, "title": last.title, "date": last.date}
        return out

    def _last_change(self, repo: _Repo, commit: _Commit, path: str) -> _Commit:
        """The oldest commit since which `path` (a file, or everything under a directory) is unchanged."""

        def view(c: _Commit) -> Any:
            return sorted((p, b.git_oid) for p, b in c.files.items() if p == path or p.startswith(path + "/"))

        here, last = view(commit), commit
        for c in self._history(repo, commit):
            if view(c) != here:
                break
            last = c
        return last

    def _tree(self, repo: _Repo, commit: _Commit, path: str, recursive: bool, expand: bool) -> list[dict] | None:
        """Entries under directory `path` ("" the root), directories first; None when `path` is no directory."""
        dirs = self._dirs(commit)
        if path and path not in dirs:
            return None
        prefix = path + "/" if path else ""

        def wanted(p: str) -> bool:
            return p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :])

        paths = sorted(d for d in dirs if wanted(d)) + sorted(p for p in commit.files if wanted(p))
        return [self._entry(repo, commit, p, expand) for p in paths]

    def _info(self, repo: _Repo, commit: _Commit, blobs: bool) -> dict[str, Any]:
        siblings = []
        for p, b in sorted(commit.files.items()):
            s: dict[str, Any] = {"rfilename": p}
            if blobs:
                s.update(size=len(b.data), blobId=b.git_oid)
                if b.lfs:
                    s["lfs"] = {"sha256": b.sha256, "size": len(b.data), "pointerSize": b.pointer_size}
            siblings.append(s)
        return {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit.sha,
            "createdAt": repo.created,
            "lastModified": commit.date,
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": sum(len(b.data) for b in commit.files.values()),
        }

    # HTTP

    def _handle(self, h: _Handler, method: str, path: str, body: bytes) -> None:
        split = urlsplit(h.path)
        seg = [unquote(s) for s in split.path.strip("/").split("/")]  # a %2F inside a segment stays in it
        if seg[0] == "api":
            with self._lock:
                return self._api(h, method, seg[1:], parse_qs(split.query), body)
        if seg[0] in ("datasets", "spaces") and len(seg) >= 6 and seg[3] == "resolve":
            return self._serve_file(h, method, path, (_TYPES[seg[0]], f"{seg[1]}/{seg[2]}"), seg[4], seg[5:])
        if len(seg) >= 5 and seg[2] == "resolve":
            return self._serve_file(h, method, path, ("model", f"{seg[0]}/{seg[1]}"), seg[3], seg[4:])
        return self._error(h, method, 404, None, f"no route {method} /{path}")

    def _api(self, h: _Handler, method: str, seg: list[str], query: dict, body: bytes) -> None:
        if method == "POST" and self.token and h.headers.get("Authorization") != f"Bearer {self.token}":
            return self._error(h, method, 401, None, "Invalid credentials in Authorization header")
        route = (method, *seg)
        if route == ("POST", "repos", "create"):
            return self._create_repo(h, json.loads(body or b"{}"))
        if route == ("POST", "validate-yaml"):
            return h.reply_json(200, method, {"errors": [], "warnings": []})
        if route == ("GET", "whoami-v2"):
            return h.reply_json(200, method, {"type": "user", "name": "stand-in", "orgs": [], "auth": {}})
        if route == ("GET", "agent-harnesses"):
            return h.reply_json(200, method, {"standardEnvVars": [], "harnesses": {}})
        if len(seg) < 3 or seg[0] not in _TYPES:
            return self._error(h, method, 404, None, f"no route {method} /api/{'/'.join(seg)}")
        repo = self._repos.get((_TYPES[seg[0]], f"{seg[1]}/{seg[2]}"))
        if repo is None:
            return self._error(h, method, 404, "RepoNotFound", f"Repository {seg[1]}/{seg[2]} not found")
        op, args = (seg[3], seg[4:]) if len(seg) > 3 else ("revision", [])
        if (method, op) == ("GET", "refs"):
            branches = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": s} for b, s in repo.branches.items()]
            return h.reply_json(200, method, {"branches": branches, "converts": [], "tags": [], "pullRequests": []})
        if (method, op) == ("POST", "branch") and args:
            return self._create_branch(h, repo, args[0], json.loads(body or b"{}"))
        commit = self._resolve(repo, args[0] if args else None)
        if commit is None:
            return self._error(h, method, 404, "RevisionNotFound", f"Invalid rev id: {args[0] if args else 'main'}")
        if (method, op) == ("GET", "revision"):
            return h.reply_json(200, method, self._info(repo, commit, _flag(query.get("blobs"))))
        if (method, op) == ("GET", "tree"):
            entries = self._tree(
                repo, commit, "/".join(args[1:]), _flag(query.get("recursive")), _flag(query.get("expand"))
            )
            if entries is None:
                return self._error(h, method, 404, "EntryNotFound", f"{'/'.join(args[1:])} is not a directory")
            return h.reply_json(200, method, entries)
        if (method, op) == ("POST", "paths-info"):
            if h.headers.get("Content-Type", "").startswith("application/json"):
                req = json.loads(body or b"{}")
                paths, expand = req.get("paths", []), bool(req.get("expand"))
            else:  # what get_paths_info sends: a form, `paths` repeated
                form = parse_qs(body.decode(), keep_blank_values=True)
                paths, expand = form.get("paths", []), _flag(form.get("expand"))
            paths = [paths] if isinstance(paths, str) else paths
            dirs = self._dirs(commit)
            found = [p.strip("/") for p in paths if p.strip("/") in commit.files or p.strip("/") in dirs]
            return h.reply_json(200, method, [self._entry(repo, commit, p, expand) for p in found])
        if (method, op) == ("GET", "commits"):
            items = [
                {"id": c.sha, "title": c.title, "message": c.message, "date": c.date, "authors": [{"user": "stand-in"}]}
                for c in self._history(repo, commit)
            ]
            return h.reply_json(200, method, items)
        if (method, op) == ("POST", "preupload"):
            files = json.loads(body or b"{}").get("files", [])
            modes = []
            for f in files:
                mode = {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                if f["path"] in commit.files:  # lets the client skip a file that has not changed
                    mode["oid"] = _git_oid(commit.files[f["path"]].data)
                modes.append(mode)
            return h.reply_json(200, method, {"files": modes, "commitOid": commit.sha})
        if (method, op) == ("POST", "commit"):
            return self._commit_route(h, repo, args[0] if args else "main", query, body)
        return self._error(h, method, 404, None, f"no route {method} /api/{'/'.join(seg)}")

    def _create_repo(self, h: _Handler, req: dict[str, Any]) -> None:
        repo_type = req.get("type") or "model"
        repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
        if (repo_type, repo_id) in self._repos:
            url = self._url(self._repos[(repo_type, repo_id)])
            return h.reply_json(409, "POST", {"error": f"You already created this {repo_type} repo", "url": url})
        return h.reply_json(200, "POST", {"url": self._url(self._create(repo_type, repo_id)), "name": repo_id})

    def _create_branch(self, h: _Handler, repo: _Repo, branch: str, req: dict[str, Any]) -> None:
        if branch in repo.branches:
            return self._error(h, "POST", 409, None, f"Reference refs/heads/{branch} already exists")
        start = self._resolve(repo, req.get("startingPoint"))
        if start is None:
            return self._error(h, "POST", 404, "RevisionNotFound", f"Invalid rev id: {req.get('startingPoint')}")
        repo.branches[branch] = start.sha
        return h.reply_json(200, "POST", {})

    def _commit_route(self, h: _Handler, repo: _Repo, branch: str, query: dict, body: bytes) -> None:
        if _flag(query.get("create_pr")):
            return self._error(h, "POST", 400, None, "create_pr is not supported by the stand-in")
        if branch not in repo.branches:
            code = None if self._resolve(repo, branch) else "RevisionNotFound"
            return self._error(h, "POST", 400 if code is None else 404, code, f"Invalid rev id: {branch} (no branch)")
        head = repo.commits[repo.branches[branch]]
        tree, header = dict(head.files), {}
        for line in body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                header = value
            elif key == "file":
                data = value["content"].encode()
                data = base64.b64decode(data) if value.get("encoding") == "base64" else data
                tree[value["path"]] = self._blob(value["path"], data)
            elif key == "lfsFile":
                if value["oid"] not in self._by_sha256:
                    return self._error(h, "POST", 422, None, f"LFS object {value['oid']} not found")
                tree[value["path"]] = self._blob(value["path"], self._by_sha256[value["oid"]].data)
            elif key == "deletedFile":
                if tree.pop(value["path"], None) is None:
                    return self._error(h, "POST", 404, "EntryNotFound", "A file with this name doesn't exist")
            elif key == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                tree = {p: b for p, b in tree.items() if not p.startswith(prefix)}
            else:
                return self._error(h, "POST", 400, None, f"unknown commit operation {key!r}")
        if header.get("parentCommit") not in (None, head.sha):
            return self._error(h, "POST", 412, None, f"A commit has happened since {header['parentCommit']}")
        commit = self._commit(repo, branch, tree, header.get("summary", ""), header.get("description", ""), body)
        out = {"success": True, "commitOid": commit.sha, "commitUrl": f"{self._url(repo)}/commit/{commit.sha}"}
        return h.reply_json(200, "POST", {**out, "pullRequestUrl": None, "hookOutput": ""})

    def _serve_file(self, h: _Handler, method: str, path: str, key: tuple[str, str], rev: str, parts: list[str]):
        if method not in ("GET", "HEAD"):
            return h.reply(405, method, headers={"Allow": "GET, HEAD"})
        with self._lock:
            repo = self._repos.get(key)
            commit = self._resolve(repo, rev) if repo else None
            blob = commit.files.get("/".join(parts)) if commit else None
        if repo is None:
            return self._error(h, method, 404, "RepoNotFound", f"Repository {key[1]} not found")
        if commit is None:
            return self._error(h, method, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if blob is None:
            msg = f"Entry not found: {'/'.join(parts)}"
            return self._error(h, method, 404, "EntryNotFound", msg, {"X-Repo-Commit": commit.sha})
        headers = {"X-Repo-Commit": commit.sha, "ETag": f'"{blob.sha256 if blob.lfs else blob.git_oid}"'}
        if blob.lfs:  # what the Hub sends for LFS files (it also redirects them to a CDN, which this skips)
            headers.update({"X-Linked-Size": str(len(blob.data)), "X-Linked-Etag": f'"{blob.sha256}"'})
        data = blob.data
        self._send_ranged(h, method, path, len(data), lambda a, b: data[a:b], headers=headers)

    def _error(
        self, h: _Handler, method: str, status: int, code: str | None, msg: str, extra: Mapping[str, str] | None = None
    ) -> None:
        headers = {"X-Error-Message": msg, **({"X-Error-Code": code} if code else {}), **(extra or {})}
        h.reply_json(status, method, {"error": msg}, headers=headers)

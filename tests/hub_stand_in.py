"""A loopback stand-in for the Hub's auth-check answers and a Hugging Face cache layout, for the tests of both
packages' model-source decisions (which repositories the Hub serves, which the cache holds)."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REVISION = "0" * 40


class HubAnswers(BaseHTTPRequestHandler):
    """The Hub's model-info and auth-check answers, per id in `answers`: (status, X-Error-Code). 200 = served; a
    gated id without access (403, GatedRepo) has public info (200, `gated: manual`) and a 403 auth-check; an id not
    listed is not found (404, RepoNotFound) on both. Two stand-ins for what is not the Hub's answer: (401, "BadToken")
    is the Hub refusing a token, (200, "HTML") a proxy's or captive portal's page."""

    answers: dict[str, tuple[int, str | None]] = {}

    def do_GET(self) -> None:
        path = self.path.split("?")[0].removeprefix("/api/models/")
        repo, auth = path.removesuffix("/auth-check"), path.endswith("/auth-check")
        status, code = self.answers.get(repo, (404, "RepoNotFound"))
        body, kind = b"{}", "application/json"
        if code == "GatedRepo" and not auth:
            status, code, body = 200, None, json.dumps({"id": repo, "gated": "manual"}).encode()
        elif code == "BadToken":
            code, body = None, json.dumps({"error": "Invalid credentials in Authorization header"}).encode()
        elif code == "HTML":
            code, body, kind = None, b"<html><body>Sign in to the network</body></html>", "text/html"
        elif status == 200 and not auth:
            body = json.dumps({"id": repo, "gated": False}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@contextmanager
def stand_in_hub() -> Iterator[str]:
    """The stand-in's URL while it serves; the answers start empty (every id not found)."""
    HubAnswers.answers = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubAnswers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def put_in_cache(cache: Path, model_dir: Path, repo_id: str) -> None:
    """`model_dir`'s files as the Hugging Face cache holds a download of `repo_id` (refs/main -> a snapshot)."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(model_dir, root / "snapshots" / REVISION)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(REVISION)


def in_a_folder_with_build(tmp_path: Path, monkeypatch) -> None:
    """Work from `tmp_path`, which holds an empty `build/`: `build/x` names a directory not built yet, not a Hub id."""
    (tmp_path / "build").mkdir()
    monkeypatch.chdir(tmp_path)

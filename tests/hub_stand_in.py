"""A loopback stand-in for the Hub's auth-check answers and a Hugging Face cache layout, for the tests of both
packages' model-source decisions (which repositories the Hub serves, which the cache holds)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REVISION = "0" * 40


class HubAnswers(BaseHTTPRequestHandler):
    """`GET /api/models/<id>/auth-check` as the Hub answers it, per id in `answers`: (status, X-Error-Code); an id
    not listed is not found (404, RepoNotFound)."""

    answers: dict[str, tuple[int, str | None]] = {}

    def do_GET(self) -> None:
        repo = self.path.removeprefix("/api/models/").removesuffix("/auth-check")
        status, code = self.answers.get(repo, (404, "RepoNotFound"))
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

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

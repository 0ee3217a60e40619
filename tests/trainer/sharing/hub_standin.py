"""A local stand-in of the three Hugging Face Hub HTTP endpoints `create_repo` + `upload_folder` call (read from
huggingface_hub 2.4's hf_api.py / _commit_api.py / _upload_pipeline.py), served from a thread:

    POST /api/repos/create                          {"name", "organization", "type"} -> {"url"}
    POST /api/validate-yaml                         {"content": README.md} -> 200, or 400 when its front matter
                                                    is not a YAML mapping (checked here with yaml.safe_load)
    POST /api/models/{repo}/preupload/{revision}    {"files": [{path, sample, size}]} -> each file's uploadMode
    POST /api/models/{repo}/commit/{revision}       NDJSON: a header line, then one line per file -> {"commitUrl", ...}

Every file is answered uploadMode "regular", so its bytes travel base64-encoded inside the commit (the Hub itself
would send large binaries through LFS / xet storage, which this stand-in does not implement). Requests without the
expected bearer token get 401, like the Hub. `repos` holds what arrived: {repo_id: {path: bytes}}.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml

TOKEN = "hf_standin_token"


class HubStandIn:
    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.repos: dict[str, dict[str, bytes]] = {}
        self.created: list[dict[str, Any]] = []
        self.validated: list[dict[str, Any]] = []  # the front matter of each README.md validated
        self.unknown: list[str] = []  # POSTs (uploads) no route answered (a test asserts it stays empty)
        self.gets: list[str] = []  # GETs, all 404: huggingface_hub's optional look-ups (e.g. /api/agent-harnesses)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _reply(self, status: int, payload: dict[str, Any]) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._reply(401, {"error": "Invalid username or password."})
                path = self.path.split("?", 1)[0]
                if path == "/api/repos/create":
                    req = json.loads(body)
                    repo = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                    hub.created.append(req)
                    hub.repos.setdefault(repo, {})
                    return self._reply(200, {"url": f"{hub.url}/{repo}", "name": repo})
                if path == "/api/validate-yaml":
                    content = json.loads(body)["content"]
                    parts = content.split("---\n", 2) if content.startswith("---\n") else []
                    try:
                        meta = yaml.safe_load(parts[1]) if len(parts) == 3 else None
                    except yaml.YAMLError as e:
                        return self._reply(400, {"errors": [{"message": f"invalid YAML: {e}"}]})
                    if not isinstance(meta, dict):
                        return self._reply(400, {"errors": [{"message": "no YAML metadata mapping"}]})
                    hub.validated.append(meta)
                    return self._reply(200, {})
                m = re.fullmatch(r"/api/models/(.+)/(preupload|commit)/([^/]+)", path)
                if m and m.group(1) in hub.repos:
                    if m.group(2) == "preupload":
                        files = json.loads(body)["files"]
                        modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                        return self._reply(200, {"files": modes})
                    for line in body.splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            value = item["value"]
                            hub.repos[m.group(1)][value["path"]] = base64.b64decode(value["content"])
                        elif item["key"] != "header":
                            hub.unknown.append(f"commit operation {item['key']}")
                    url = f"{hub.url}/{m.group(1)}/commit/{'a' * 40}"
                    return self._reply(200, {"commitUrl": url, "commitOid": "a" * 40, "pullRequestUrl": None})
                hub.unknown.append(f"POST {self.path}")
                return self._reply(404, {"error": f"no route {self.path}"})

            def do_GET(self) -> None:
                hub.gets.append(self.path)
                self._reply(404, {"error": f"no route {self.path}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

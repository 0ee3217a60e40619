"""Helpers for the downloader tests and benchmark: generated media files and a local HTTP server on
127.0.0.1 (an ephemeral port, no other address) that plays the part of YouTube for yt-dlp's generic
extractor: a direct media URL per ytid, plus routes that 404, 503 once, or cut the body short."""

from __future__ import annotations

import csv
import subprocess
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import soundfile as sf

from tests.pipeline.helpers import MUSICCAPS_CSV
from tokenizer_pipeline.ffmpeg_binary import find_ffmpeg

CONTENT_TYPES = {"wav": "audio/wav", "flac": "audio/flac", "m4a": "audio/mp4", "webm": "audio/webm", "ogg": "audio/ogg"}


def music_like(seconds: float, sr: int, channels: int = 2, seed: int = 0) -> np.ndarray:
    """`[N, C]` float32: a few partials with a slow vibrato and a little noise, so a lossy codec keeps
    the waveform (white noise alone would not survive AAC at 128 kbps) and a shifted window shows."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * sr))) / sr
    chans = []
    for c in range(channels):
        f0 = 220.0 * (1 + 0.25 * c) * (1 + 0.01 * np.sin(2 * np.pi * 0.7 * t))
        x = sum(0.2 / k * np.sin(2 * np.pi * k * np.cumsum(f0) / sr) for k in (1, 2, 3, 5))
        chans.append(x + 0.01 * rng.standard_normal(t.shape))
    return np.stack(chans, axis=1).astype(np.float32)  # [N, C]


def write_media(path: Path, seconds: float, sr: int = 44100, channels: int = 2, seed: int = 0) -> np.ndarray:
    """Write `path` (.wav as 16-bit PCM; .flac, .m4a AAC, .webm Opus, .ogg Vorbis encoded by the ffmpeg binary).

    Returns the `[N, C]` float32 signal as the 16-bit wav holds it (the reference for a window).
    """
    return write_signal(path, music_like(seconds, sr, channels, seed), sr)


def write_signal(path: Path, signal: np.ndarray, sr: int, bitrate: str | None = None) -> np.ndarray:
    """Write the `[N, C]` float `signal` to `path` as write_media does; `bitrate` overrides the lossy default.

    Returns the `[N, C]` float32 signal as the 16-bit wav holds it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    wav = path.with_suffix(".wav")
    sf.write(wav, signal, sr, subtype="PCM_16")
    ref, _ = sf.read(wav, dtype="float32", always_2d=True)  # [N, C]
    codec = {".wav": None, ".flac": ["-c:a", "flac"], ".m4a": ["-c:a", "aac", "-b:a", bitrate or "128k"],
             ".webm": ["-c:a", "libopus", "-b:a", bitrate or "96k"], ".ogg": ["-c:a", "libvorbis"]}[path.suffix]  # fmt: skip
    if codec is not None:
        subprocess.run(
            [find_ffmpeg(), "-nostdin", "-loglevel", "error", "-y", "-i", str(wav), *codec, str(path)], check=True
        )
        wav.unlink()
    return ref


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(
        self, request, client_address
    ) -> None:  # clients hang up early on purpose (truncation, yt-dlp probing)
        pass


@dataclass
class Route:
    body: bytes = b""
    content_type: str = "audio/wav"
    status: int = 200
    fail_first: int = 0  # answer 503 to this many requests first
    send_bytes: int | None = None  # announce len(body) but send only this many bytes, then close


class MediaServer:
    """`ThreadingHTTPServer` on 127.0.0.1:<ephemeral>; `routes["/media/<ytid>"] = Route(...)`; `hits` counts GETs per path."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.hits: dict[str, int] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                self._answer(head=True)

            def do_GET(self) -> None:
                self._answer(head=False)

            def _answer(self, head: bool) -> None:
                with server.lock:
                    n = server.hits[self.path] = server.hits.get(self.path, 0) + 1
                route = server.routes.get(self.path)
                if route is None or route.status == 404:
                    return self._status(404)
                if n <= route.fail_first:
                    return self._status(503)
                self.send_response(route.status)
                self.send_header("Content-Type", route.content_type)
                self.send_header("Content-Length", str(len(route.body)))
                self.end_headers()
                if head:
                    return
                if route.send_bytes is None:
                    self.wfile.write(route.body)
                else:
                    self.wfile.write(route.body[: route.send_bytes])
                    self.close_connection = True

            def _status(self, code: int) -> None:
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.lock = threading.Lock()
        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url_template(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/media/{{ytid}}"

    def serve_file(self, ytid: str, path: Path, **kw) -> Route:
        route = Route(body=path.read_bytes(), content_type=CONTENT_TYPES[path.suffix.lstrip(".")], **kw)
        self.routes[f"/media/{ytid}"] = route
        return route

    def __enter__(self) -> MediaServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def write_csv_rows(out: Path, n: int, windows: list[tuple[float, float]]) -> tuple[Path, list[dict[str, str]]]:
    """The first `n` rows of the real MusicCaps CSV, with start_s/end_s replaced by `windows` (short test windows)."""
    with MUSICCAPS_CSV.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames
        rows = [row for _, row in zip(range(n), reader)]
    for row, (a, b) in zip(rows, windows):
        row["start_s"], row["end_s"] = str(a), str(b)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return out, rows

"""Helpers for the downloader tests and benchmark: generated media files and a local HTTP server on
127.0.0.1 (an ephemeral port, no other address) that plays the part of YouTube for yt-dlp's generic
extractor: a direct media URL per ytid, plus routes that 404, 503 once, or cut the body short."""

from __future__ import annotations

import csv
import re
import subprocess
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import soundfile as sf

from tests.pipeline.helpers import MUSICCAPS_CSV
from tokenizer_pipeline.audio.ffmpeg_binary import find_ffmpeg

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
    if path.suffix != ".wav":
        encode_wav(wav, path, bitrate)
        wav.unlink()
    return ref


def encode_wav(wav: Path, path: Path, bitrate: str | None = None) -> Path:
    """Encode the 16-bit `wav` into `path` by its suffix (.flac, .m4a AAC, .webm Opus, .ogg Vorbis), as write_media
    does; `bitrate` overrides the lossy default."""
    codec = {".flac": ["-c:a", "flac"], ".m4a": ["-c:a", "aac", "-b:a", bitrate or "128k"],
             ".webm": ["-c:a", "libopus", "-b:a", bitrate or "96k"], ".ogg": ["-c:a", "libvorbis"]}[path.suffix]  # fmt: skip
    subprocess.run(
        [find_ffmpeg(), "-nostdin", "-loglevel", "error", "-y", "-i", str(wav), *codec, str(path)], check=True
    )
    return path


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
    send_bytes: int | None = None  # send only the body's first this many bytes (announcing more), then close
    ranges: bool = True  # honour `Range: bytes=a-b` (206); False: ignore it and send the whole body (200)


CHUNK = 16 * 1024  # bytes per socket write: `sent` counts what was written, up to one chunk more than the client read


class MediaServer:
    """`ThreadingHTTPServer` on 127.0.0.1:<ephemeral>; `routes["/media/<ytid>"] = Route(...)`; `hits` counts
    requests per path, `sent` the body bytes written per path (what a client downloaded)."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.hits: dict[str, int] = {}
        self.sent: dict[str, int] = {}
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
                size = len(route.body)
                first, last = 0, size - 1
                m = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "").strip())
                partial = route.ranges and m is not None and route.status == 200 and (m.group(1) or m.group(2))
                if partial:
                    if m.group(1):
                        first, last = int(m.group(1)), min(int(m.group(2) or size - 1), size - 1)
                    else:  # bytes=-N: the last N bytes
                        first = max(size - int(m.group(2)), 0)
                    if first >= size or first > last:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        return self.end_headers()
                self.send_response(206 if partial else route.status)
                self.send_header("Content-Type", route.content_type)
                self.send_header("Content-Length", str(last + 1 - first))
                if route.ranges:
                    self.send_header("Accept-Ranges", "bytes")
                if partial:
                    self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
                self.end_headers()
                if head:
                    return
                # the truncated route stops at byte send_bytes of the body, whatever range was asked
                stop = last + 1 if route.send_bytes is None else min(last + 1, route.send_bytes)
                for a in range(first, stop, CHUNK):
                    chunk = route.body[a : min(a + CHUNK, stop)]
                    try:
                        self.wfile.write(chunk)
                    except OSError:  # the client hung up (ffmpeg stops reading once it has its section)
                        self.close_connection = True
                        return
                    with server.lock:
                        server.sent[self.path] = server.sent.get(self.path, 0) + len(chunk)
                if stop < last + 1:
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
        """A direct media URL per ytid (yt-dlp's generic extractor GETs it once to see its type, then downloads)."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/media/{{ytid}}"

    @property
    def watch_template(self) -> str:
        """A watch page per ytid whose `<audio src>` is the media, as a video page links its stream: extraction
        reads only the page, so `media_bytes` counts just what the download itself fetched."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/watch/{{ytid}}"

    def serve_file(self, ytid: str, path: Path, **kw) -> Route:
        ext = path.suffix.lstrip(".")
        route = Route(body=path.read_bytes(), content_type=CONTENT_TYPES[ext], **kw)
        self.routes[f"/media/{ytid}"] = self.routes[f"/media/{ytid}.{ext}"] = route
        page = f'<html><head><title>{ytid}</title></head><body><audio src="/media/{ytid}.{ext}"></audio></body></html>'
        self.routes[f"/watch/{ytid}"] = Route(body=page.encode(), content_type="text/html")
        return route

    def media_bytes(self, ytid: str) -> int:
        """Body bytes sent for `ytid`'s media (by either URL)."""
        return sum(n for p, n in self.sent.items() if p == f"/media/{ytid}" or p.startswith(f"/media/{ytid}."))

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

"""The local shard cache: remote tars fetched once per node, verified against the manifest, bounded in bytes.

Layout of `data.cache.dir` (shared by the node's ranks and workers): `<sha256>.tar` verified shards,
`<sha256>-<bytes>.<pid>.<n>.part` downloads in flight (counted at <bytes>), `indexes/<sha256>.safetensors` kept index
sidecars, `.locks/<xx>.lock` per-download locks by the sha256's first byte, `.lock` for counting, evicting and
renaming, `.stats.json` counters. A tar appears only by atomic rename once its size and sha256 match; readers hold a
shared flock, which eviction never waits on (fcntl.flock: filelock has no shared mode). The bound counts the whole
directory as `du -sb` does, bookkeeping included; eviction takes kept index copies first, then the shard used
farthest ahead in the example order (a planner's `next_use`; LRU for ties or with policy "lru"). max_bytes = 0: no
bound.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from filelock import FileLock, Timeout

from adapter_trainer.data.remote.retry import with_retries
from adapter_trainer.data.remote.urls import filesystem, protocol
from adapter_trainer.errors import UserError

POLICIES = ("order", "lru")
HEADROOM_BYTES = 16 * 1024  # kept free at each count for what appears before the next one
# what a bound needs beyond its shards: the cache's own files on a filesystem with 4 KiB directory blocks (three
# directories, up to 256 empty lock files, the counters) plus the headroom
BOOKKEEPING_BYTES = 64 * 1024
INDEXES = "indexes"
_BLOCK = 1 << 20
_COUNTER = itertools.count()


class ShardCacheError(UserError, OSError):
    """A shard cannot be made available: corrupt at its URL, or no room under data.cache.max_bytes."""


@dataclass(frozen=True)
class RemoteShard:
    """One tar of a remote set, as its manifest lists it."""

    url: str  # <set url>/<manifest path>, with a Hub revision pinned
    sha256: str
    bytes: int
    path: str = ""  # the manifest's path of the tar, e.g. "train/shard-000003.tar" (for messages)


def default_cache_dir() -> Path:
    """$ADAPTER_TRAINER_SHARD_CACHE, else $XDG_CACHE_HOME/adapter_trainer/shards (~/.cache/... by default)."""
    env = os.environ.get("ADAPTER_TRAINER_SHARD_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "adapter_trainer" / "shards"


class ShardCache:
    """Remote shards as verified local files under `root`, at most `max_bytes` on disk (0 = no bound)."""

    def __init__(
        self,
        root: str | Path,
        max_bytes: int = 0,
        *,
        policy: str = "order",
        tries: int = 5,
        wait_s: float = 600.0,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"cache policy {policy!r}: choose one of {', '.join(POLICIES)}")
        self.root = Path(root).expanduser()
        self.max_bytes, self.policy, self.tries, self.wait_s = int(max_bytes), policy, tries, wait_s
        # next_use(sha) -> examples until this node reads the shard (inf: not within the planner's horizon)
        self.next_use: Callable[[str], float] | None = None
        self._ready_pid = -1

    def __getstate__(self) -> dict:  # a worker gets the settings; it sets up its own directory state
        return {**self.__dict__, "_ready_pid": -1}

    # ---- paths and state
    def path(self, sha256: str) -> Path:
        return self.root / f"{sha256}.tar"

    def present(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def _lock(self) -> FileLock:
        return FileLock(str(self.root / ".lock"))

    def _shard_lock(self, sha256: str) -> FileLock:
        # one lock per first byte of the sha256: filelock leaves its files, so at most 256 keep .locks/ bounded
        return FileLock(str(self.root / ".locks" / f"{sha256[:2]}.lock"))

    def download_lock(self, sha256: str) -> FileLock:
        """The node-wide lock of one download by sha256 (a tar or an index sidecar): its holder alone fetches it."""
        self._ready()
        return self._shard_lock(sha256)

    def index_path(self, sha256: str) -> Path:
        return self.root / INDEXES / f"{sha256}.safetensors"

    def _ready(self) -> None:
        """Create the directories and delete leftovers of dead downloads, once per process."""
        if self._ready_pid == os.getpid():
            return
        (self.root / ".locks").mkdir(parents=True, exist_ok=True)
        (self.root / INDEXES).mkdir(exist_ok=True)
        self._reap_dead_parts()
        self._ready_pid = os.getpid()

    def _reap_dead_parts(self) -> None:
        """Delete every .part whose shard lock nobody holds: its download died (a killed process, on this node)."""
        for part in self.root.glob("*.part"):
            sha = part.name.split("-", 1)[0]
            try:
                with self._shard_lock(sha).acquire(timeout=0):
                    part.unlink(missing_ok=True)
            except Timeout:
                pass  # a live download of that shard

    def used_bytes(self) -> int:
        """The directory's footprint as `du -sb` counts it, each download in flight at its full reserved size."""
        total, dirs = 0, [self.root]
        while dirs:
            d = dirs.pop()
            try:
                total += d.stat().st_size
                entries = list(os.scandir(d))
            except FileNotFoundError:
                continue
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        dirs.append(Path(e.path))
                        continue
                    size = e.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
                if e.name.endswith(".part"):
                    size = max(size, _reserved(e.name))
                total += size
        return total

    def stats(self) -> dict[str, int]:
        """Counters since the cache directory was made: downloads, bytes_downloaded, evictions, peak_bytes."""
        f = self.root / ".stats.json"
        try:
            return json.loads(f.read_text())
        except (FileNotFoundError, ValueError):
            return {"downloads": 0, "bytes_downloaded": 0, "evictions": 0, "peak_bytes": 0}

    def _bump(self, **add: int) -> None:  # under self._lock()
        s = self.stats()
        for k, v in add.items():
            s[k] = max(s.get(k, 0), v) if k == "peak_bytes" else s.get(k, 0) + v
        tmp = self.root / f".stats.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(s, allow_nan=False))
        os.replace(tmp, self.root / ".stats.json")

    # ---- eviction
    def _distance(self, sha: str) -> float:
        if self.policy == "lru" or self.next_use is None:
            return math.inf
        return self.next_use(sha)

    def _make_room(self, need: int, sha: str, admit_within: float | None, *, evict_tars: bool = True) -> bool:
        """Under self._lock(): evict until `need` more bytes fit (index copies first, then tars; with admit_within
        only tars used later than that; without evict_tars none). False when it cannot fit now."""
        if not self.max_bytes:
            return True
        self._reap_dead_parts()
        for tmp in self.root.glob(".stats.*.tmp"):  # written under this lock: a leftover of a killed process
            tmp.unlink(missing_ok=True)
        used = self.used_bytes() + HEADROOM_BYTES
        if used + need <= self.max_bytes:
            return True
        candidates = [(-math.inf, -math.inf, p) for p in self._by_mtime((self.root / INDEXES).glob("*.safetensors"))]
        if evict_tars and not (admit_within is not None and self.policy == "lru"):  # LRU prefetch: free room only
            tars = [(p, p.name[: -len(".tar")]) for p in self._by_mtime(self.root.glob("*.tar"))]
            ranked = [(-self._distance(other), i, p) for i, (p, other) in enumerate(tars) if other != sha]
            candidates += sorted(ranked)  # farthest next use first, then least recently used
        for neg_dist, _, p in candidates:
            if p.suffix == ".tar" and admit_within is not None and -neg_dist <= admit_within:
                return False  # every tar left is needed no later than the shard we would prefetch
            size = self._evict(p, counted=p.suffix == ".tar")
            if size:
                used -= size
                if used + need <= self.max_bytes:
                    return True
        return False

    @staticmethod
    def _by_mtime(paths) -> list[Path]:
        """`paths` oldest first (a file gone meanwhile is left out)."""
        dated = []
        for p in paths:
            with contextlib.suppress(FileNotFoundError):
                dated.append((p.stat().st_mtime, p))
        return [p for _, p in sorted(dated)]

    def _evict(self, p: Path, *, counted: bool = True) -> int:
        """Remove `p` unless a reader holds it; its size, or 0. counted: an eviction in .stats.json (a tar's)."""
        try:
            f = open(p, "rb")  # noqa: SIM115 (closed below, after the unlink)
        except FileNotFoundError:
            return 0
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return 0  # being read
        try:
            size = os.fstat(f.fileno()).st_size
            p.unlink()
            if counted:
                self._bump(evictions=1)
            return size
        finally:
            f.close()

    # ---- fetching
    def fetch(self, shard: RemoteShard, *, what: str, admit_within: float | None = None) -> bool:
        """Make `shard` a verified local file; False only for a prefetch (admit_within) that found no room."""
        self._ready()
        if self.present(shard.sha256):
            return True
        if self.max_bytes and shard.bytes + BOOKKEEPING_BYTES > self.max_bytes:
            raise ShardCacheError(
                f"{what} ({shard.url}) is {shard.bytes} bytes, and the cache's own files take up to "
                f"{BOOKKEEPING_BYTES}, but data.cache.max_bytes={self.max_bytes}; raise data.cache.max_bytes to at "
                f"least a few shards (the largest is >= {shard.bytes})"
            )
        with self._shard_lock(shard.sha256):  # one download per shard per node; the others wait here
            if self.present(shard.sha256):
                return True
            part = self._reserve(shard, what=what, admit_within=admit_within)
            if part is None:
                return False
            try:
                self._download_verified(shard, part, what=what)
                with self._lock():
                    os.replace(part, self.path(shard.sha256))
                    self._bump(downloads=1, bytes_downloaded=shard.bytes)
            finally:
                part.unlink(missing_ok=True)
        return True

    def _reserve(self, shard: RemoteShard, *, what: str, admit_within: float | None) -> Path | None:
        """An empty .part file that reserves shard.bytes, after making room (waits for readers on demand)."""
        deadline = time.monotonic() + self.wait_s
        while True:
            with self._lock():
                if self._make_room(shard.bytes, shard.sha256, admit_within):
                    return self._new_part(shard.sha256, shard.bytes)
            if admit_within is not None:
                return None
            if time.monotonic() > deadline:
                raise ShardCacheError(
                    f"{what}: no room in {self.root} under data.cache.max_bytes={self.max_bytes} for "
                    f"{self.wait_s:.0f} s: every cached shard is being read. Raise data.cache.max_bytes to at least "
                    f"(ranks on this node x (DataLoader workers + 1)) x the largest shard"
                )
            time.sleep(0.05)

    def _new_part(self, sha256: str, nbytes: int) -> Path:
        """Under self._lock(), after `_make_room`: an empty .part file that reserves `nbytes` (its name says how many)."""
        part = self.root / f"{sha256}-{nbytes}.{os.getpid()}.{next(_COUNTER)}.part"
        part.touch()
        self._bump(peak_bytes=self.used_bytes())
        return part

    def keep_index(self, sha256: str, data: bytes) -> bool:
        """Keep an index sidecar's verified bytes as `index_path(sha256)` within the bound (the caller holds
        `download_lock(sha256)`); False when there is no room (the next start fetches it again)."""
        self._ready()
        with self._lock():
            if not self._make_room(len(data), sha256, admit_within=None, evict_tars=False):
                return False
            part = self._new_part(sha256, len(data))
        try:
            part.write_bytes(data)
            with self._lock():
                os.replace(part, self.index_path(sha256))
        finally:
            part.unlink(missing_ok=True)
        return True

    def _download_verified(self, shard: RemoteShard, part: Path, *, what: str) -> None:
        """Download into `part` and check size + sha256; a mismatch is fetched once more, then refused."""
        for attempt in (1, 2):
            got = self._download(shard, part, what=what)
            if got == shard.sha256:
                return
            part.write_bytes(b"")
            if attempt == 2:
                raise ShardCacheError(
                    f"{what}: {shard.url} has sha256 {got}, but the manifest lists {shard.sha256} (fetched twice); "
                    f"the copy at the URL is corrupt or was replaced after the manifest: re-push the set "
                    f"(python -m tokenizer_pipeline.push) or check it with python -m tokenizer_pipeline.verify URL"
                )

    def _download(self, shard: RemoteShard, part: Path, *, what: str) -> str:
        """Stream the URL into `part`; the sha256 of what was written, or a marker when the size differs.

        HTTP(S) is one streamed GET (no Range requests, which some servers ignore); S3, GCS and the Hub by blocks.
        A cut transfer resumes where the file can seek, else restarts; a body that ends short is a mismatch."""
        fs, path = filesystem(shard.url)
        streamed = protocol(shard.url) in ("http", "https")
        state = {"n": 0, "h": hashlib.sha256()}

        def restart() -> None:
            state["n"], state["h"] = 0, hashlib.sha256()
            part.write_bytes(b"")

        def attempt() -> None:
            with fs.open(path, "rb", block_size=0 if streamed else _BLOCK) as src:
                if state["n"]:
                    try:
                        src.seek(state["n"])
                    except (ValueError, OSError):  # a streamed file cannot seek: read it all again
                        restart()
                with part.open("ab") as dst:
                    while state["n"] <= shard.bytes:
                        chunk = src.read(min(_BLOCK, shard.bytes + 1 - state["n"]))
                        if not chunk:
                            break
                        state["h"].update(chunk)
                        dst.write(chunk)
                        state["n"] += len(chunk)

        with_retries(attempt, what=what, url=shard.url, tries=self.tries)
        if state["n"] != shard.bytes:
            return f"<{'more than ' if state['n'] > shard.bytes else ''}{state['n']} bytes, not {shard.bytes}>"
        return state["h"].hexdigest()

    # ---- reading
    def open(self, shard: RemoteShard, *, what: str) -> BinaryIO:
        """A read handle of the verified local copy, held (shared flock) until closed: never evicted meanwhile."""
        while True:
            self.fetch(shard, what=what)
            p = self.path(shard.sha256)
            try:
                f = open(p, "rb")  # noqa: SIM115 (the caller closes it)
            except FileNotFoundError:
                continue  # evicted between fetch and open
            fcntl.flock(f, fcntl.LOCK_SH)
            if os.fstat(f.fileno()).st_nlink == 0:  # evicted before our lock: fetch again
                f.close()
                continue
            with contextlib.suppress(FileNotFoundError):
                os.utime(p)  # recency, for LRU
            return f


def _reserved(part_name: str) -> int:
    """The bytes a `<sha256>-<bytes>.<pid>.<n>.part` file reserves (0 for another name)."""
    try:
        return int(part_name.split(".", 1)[0].rsplit("-", 1)[1])
    except (ValueError, IndexError):
        return 0


def cache_for(
    paths: list[str], *, cache_dir: str = "", max_bytes: int = 0, policy: str = "order", tries: int = 5
) -> ShardCache | None:
    """The ShardCache for the remote sets among `paths` (data.cache.*); None when every set is a directory."""
    from adapter_trainer.data.remote.urls import is_url

    if not any(is_url(p) for p in paths):
        return None
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return ShardCache(root, max_bytes, policy=policy, tries=tries)

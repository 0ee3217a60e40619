"""Where a push writes: a directory (temp file + atomic rename) or an fsspec bucket (s3://, gs://: one PUT per object).

Both know which files are already there with the right content (a push resumes), read the manifest a destination
holds, and upload files in the order given; the caller sends the tars first and manifest.json last.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Protocol

from fsspec import AbstractFileSystem

from ..errors import PipelineError
from .local_set import LocalSet, SetFile
from .retry import ShortReadError, with_retries
from .urls import join

Done = Callable[[SetFile], None]  # called once a file is at the destination


class Destination(Protocol):
    """A place a shard set is pushed to."""

    url: str

    def prepare(self) -> None:
        """Create what must exist before the first upload (a Hub repo); check the place can be written."""

    def final_files(self, local: LocalSet) -> list[SetFile]:
        """The files sent after every tar, manifest.json last."""

    def present(self, files: Sequence[SetFile]) -> set[str]:
        """`rel` of each file already at the destination with the same content."""

    def read_manifest(self) -> bytes | None:
        """The destination's manifest.json, or None."""

    def upload_shards(self, files: Sequence[SetFile], done: Done) -> None:
        """Send the tars (in any order, possibly several at once)."""

    def upload_final(self, files: Sequence[SetFile], done: Done) -> None:
        """Send the small files, then manifest.json: the commit point."""

    def closing_lines(self) -> list[str]:
        """What to print after the push (the Hub: the revision to train from)."""


def hash_stream(read: Callable[[int], bytes]) -> tuple[int, str]:
    """(bytes, sha256) of a stream read in 1 MiB chunks."""
    h, n = hashlib.sha256(), 0
    while chunk := read(1 << 20):
        h.update(chunk)
        n += len(chunk)
    return n, h.hexdigest()


def run_all(files: Sequence[SetFile], send: Callable[[SetFile], None], done: Done, jobs: int) -> None:
    """send() each file on up to `jobs` threads, done() as each completes; the first error cancels the files not
    started yet, lets the running ones finish, and is raised."""
    if jobs <= 1:
        for f in files:
            send(f)
            done(f)
        return
    error: BaseException | None = None
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(send, f): f for f in files}
        for fut in as_completed(futures):
            if fut.cancelled():
                continue
            e = fut.exception()
            if e is None:
                done(futures[fut])
            elif error is None:
                error = e
                for other in futures:
                    other.cancel()
    if error is not None:
        raise error


class FileByFile:
    """Uploads one file at a time through `_send_retried`: the tars on `jobs` threads, the final files in order."""

    jobs: int

    def _send_retried(self, f: SetFile) -> None:
        raise NotImplementedError

    def upload_shards(self, files: Sequence[SetFile], done: Done) -> None:
        run_all(files, self._send_retried, done, self.jobs)

    def upload_final(self, files: Sequence[SetFile], done: Done) -> None:
        run_all(files, self._send_retried, done, 1)

    def closing_lines(self) -> list[str]:
        return []


class DirectoryDestination(FileByFile):
    """A directory on this machine: each file goes to a temp name in its folder, is fsynced, then renamed."""

    def __init__(self, root: Path, jobs: int = 1) -> None:
        self.root = root
        self.url = str(root)
        self.jobs = jobs

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def final_files(self, local: LocalSet) -> list[SetFile]:
        if self.root.resolve() == local.root.resolve():
            raise PipelineError(f"{self.root}: the destination is the shard set itself; name another directory")
        return [*local.extras, local.manifest_file]

    def present(self, files: Sequence[SetFile]) -> set[str]:
        found = set()
        for f in files:
            p = self.root / f.rel
            if p.is_file() and p.stat().st_size == f.size:
                with p.open("rb") as fh:
                    if hash_stream(fh.read)[1] == f.sha256:
                        found.add(f.rel)
        return found

    def read_manifest(self) -> bytes | None:
        p = self.root / "manifest.json"
        return p.read_bytes() if p.is_file() else None

    def _send(self, f: SetFile) -> None:
        dst = self.root / f.rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.push-{os.getpid()}.tmp")
        try:
            h = hashlib.sha256()
            with tmp.open("wb") as out:
                if f.data is not None:
                    out.write(f.data)
                    h.update(f.data)
                else:
                    with f.path.open("rb") as src:  # type: ignore[union-attr]
                        while chunk := src.read(1 << 20):
                            out.write(chunk)
                            h.update(chunk)
                out.flush()
                os.fsync(out.fileno())
            if h.hexdigest() != f.sha256:
                raise PipelineError(f"{f.path}: changed while being pushed (its sha256 is no longer the manifest's)")
            os.replace(tmp, dst)
            fd = os.open(dst.parent, os.O_RDONLY)
            try:
                os.fsync(fd)  # the rename itself survives a crash
            finally:
                os.close(fd)
        finally:
            tmp.unlink(missing_ok=True)

    def _send_retried(self, f: SetFile) -> None:
        with_retries(lambda: self._send(f), what=f"writing {f.rel}", url=str(self.root / f.rel))


class BucketDestination(FileByFile):
    """An object store through fsspec (s3://, gs://): `put_file` per object; a PUT is atomic per object."""

    def __init__(self, url: str, fs: AbstractFileSystem, root: str, jobs: int = 4) -> None:
        self.url, self.fs, self.root, self.jobs = url.rstrip("/"), fs, root, jobs

    def prepare(self) -> None:
        pass  # the bucket must exist: the first PUT into a missing one fails with one line naming it

    def final_files(self, local: LocalSet) -> list[SetFile]:
        return [*local.extras, local.manifest_file]

    def _listing(self) -> dict[str, int]:
        """rel -> size of every object under the set's root."""
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            return {}
        prefix = self.root + "/"
        return {p[len(prefix) :]: int(i.get("size") or 0) for p, i in found.items() if p.startswith(prefix)}

    def _remote_sha256(self, rel: str, size: int) -> str:
        with self.fs.open(join(self.root, rel), "rb") as fh:
            n, digest = hash_stream(fh.read)
        if n != size:
            raise ShortReadError(f"read {n} of {size} bytes")
        return digest

    def present(self, files: Sequence[SetFile]) -> set[str]:
        # Object stores hold no portable sha256: an ETag is an MD5 only for single-part uploads, and checksum
        # headers are optional and differ between S3, GCS and S3-compatible servers. So a file of the right size is
        # read back and hashed: slower than a HEAD, but it proves the bytes (a flipped byte is re-uploaded).
        sizes = with_retries(self._listing, what="listing the destination", url=self.url)
        candidates = [f for f in files if sizes.get(f.rel) == f.size]

        def same(f: SetFile) -> bool:
            read = lambda: self._remote_sha256(f.rel, f.size)
            return with_retries(read, what=f"reading back {f.rel}", url=join(self.url, f.rel)) == f.sha256

        with ThreadPoolExecutor(max_workers=max(1, self.jobs)) as pool:
            return {f.rel for f, ok in zip(candidates, pool.map(same, candidates)) if ok}

    def read_manifest(self) -> bytes | None:
        def cat() -> bytes | None:
            try:
                return self.fs.cat_file(join(self.root, "manifest.json"))
            except FileNotFoundError:
                return None

        return with_retries(cat, what="reading manifest.json", url=join(self.url, "manifest.json"))

    def _send_retried(self, f: SetFile) -> None:
        rpath = join(self.root, f.rel)
        if f.data is not None:
            send = lambda: self.fs.pipe_file(rpath, f.data)
        else:
            send = lambda: self.fs.put_file(str(f.path), rpath)
        with_retries(send, what=f"uploading {f.rel}", url=join(self.url, f.rel))

"""A Hugging Face dataset repo as a destination: the tars in batched commits, then one commit with README.md and
manifest.json, so a revision that holds a manifest holds all its shards. A file whose LFS sha256 (or git blob sha1)
equals ours is skipped, so a later push resumes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from urllib.parse import quote

from huggingface_hub import CommitOperationAdd, HfApi, HfFileSystem
from huggingface_hub.hf_api import RepoFile

from .dataset_card import dataset_card
from .destinations import Done
from .local_set import LocalSet, SetFile, file_from_bytes
from .retry import with_retries
from .urls import HubTarget, RemoteError

MAX_FILES_PER_COMMIT = 50
MAX_BYTES_PER_COMMIT = 2 * 1024**3
PATHS_PER_REQUEST = 100  # paths asked about in one paths-info request
CARD = "README.md"
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a regular (non-LFS) file with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def batches(files: Sequence[SetFile]) -> Iterator[list[SetFile]]:
    """Consecutive runs of at most MAX_FILES_PER_COMMIT files and MAX_BYTES_PER_COMMIT bytes (one file at least)."""
    batch: list[SetFile] = []
    size = 0
    for f in files:
        if batch and (len(batch) >= MAX_FILES_PER_COMMIT or size + f.size > MAX_BYTES_PER_COMMIT):
            yield batch
            batch, size = [], 0
        batch.append(f)
        size += f.size
    if batch:
        yield batch


class HubDestination:
    """`hf://datasets/<owner>/<name>[@<branch>][/<path>]`: created if missing (`private` when asked)."""

    def __init__(self, target: HubTarget, private: bool = False, api: HfApi | None = None) -> None:
        if target.revision and COMMIT_SHA.match(target.revision):
            raise RemoteError(f"{target.url()}: a push goes to a branch, not to a commit; name a branch after '@'")
        self.target = target
        self.private = private
        self.api = api or HfApi()
        self.url = target.url()
        self.last_commit: str | None = None

    def _call(self, what: str, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        return with_retries(lambda: fn(*args, **kwargs), what=what, url=self.url)

    def prepare(self) -> None:
        t = self.target
        self._call(
            "creating the dataset repo", self.api.create_repo, t.repo_id, repo_type="dataset", exist_ok=True,
            private=True if self.private else None,
        )  # fmt: skip
        if t.revision and t.revision != "main" and not t.revision.startswith("refs/"):
            self._call(
                f"creating branch {t.revision}", self.api.create_branch, t.repo_id, branch=t.revision,
                repo_type="dataset", exist_ok=True,
            )  # fmt: skip

    def final_files(self, local: LocalSet) -> list[SetFile]:
        own = next((f for f in local.extras if f.rel.lower() == CARD.lower()), None)
        card = dataset_card(local.manifest, self.target, own.read().decode("utf-8", "replace") if own else None)
        extras = [f for f in local.extras if f is not own]
        return [*extras, file_from_bytes(CARD, card.encode("utf-8"), "card"), local.manifest_file]

    def _paths_info(self, paths: list[str]) -> dict[str, RepoFile]:
        out: dict[str, RepoFile] = {}
        for i in range(0, len(paths), PATHS_PER_REQUEST):
            chunk = paths[i : i + PATHS_PER_REQUEST]
            infos = self._call(
                "listing the repo", self.api.get_paths_info, self.target.repo_id, chunk, repo_type="dataset",
                revision=self.target.revision,
            )  # fmt: skip
            out.update({x.path: x for x in infos if isinstance(x, RepoFile)})
        return out

    def present(self, files: Sequence[SetFile]) -> set[str]:
        infos = self._paths_info([self.target.repo_path(f.rel) for f in files])
        found = set()
        for f in files:
            info = infos.get(self.target.repo_path(f.rel))
            if info is None or info.size != f.size:
                continue
            if info.lfs is not None:
                same = info.lfs.sha256 == f.sha256
            else:
                same = info.blob_id == git_blob_sha1(f.read())
            if same:
                found.add(f.rel)
        return found

    def read_manifest(self) -> bytes | None:
        t = self.target
        rev = f"@{quote(t.revision, safe='')}" if t.revision else ""
        path = f"datasets/{t.repo_id}{rev}/{t.repo_path('manifest.json')}"

        def cat() -> bytes | None:
            fs = HfFileSystem(endpoint=self.api.endpoint, token=self.api.token, skip_instance_cache=True)
            try:
                return fs.cat_file(path)
            except FileNotFoundError:
                return None

        return with_retries(cat, what="reading manifest.json", url=self.url)

    def _commit(self, files: Sequence[SetFile], message: str, done: Done) -> None:
        if not files:
            return

        def ops() -> list[CommitOperationAdd]:  # fresh each try: create_commit mutates them
            return [
                CommitOperationAdd(
                    path_in_repo=self.target.repo_path(f.rel),
                    path_or_fileobj=f.data if f.data is not None else str(f.path),
                )
                for f in files
            ]

        info = self._call(
            message, lambda: self.api.create_commit(
                self.target.repo_id, ops(), commit_message=message, repo_type="dataset", revision=self.target.revision
            ),
        )  # fmt: skip
        self.last_commit = info.oid
        for f in files:
            done(f)

    def upload_shards(self, files: Sequence[SetFile], done: Done) -> None:
        n = 0
        for batch in batches(files):
            first, n = n + 1, n + len(batch)
            self._commit(batch, f"tokenizer_pipeline.push: files {first}-{n} of {len(files)}", done)

    def upload_final(self, files: Sequence[SetFile], done: Done) -> None:
        names = ", ".join(f.rel for f in files)
        self._commit(files, f"tokenizer_pipeline.push: {names}", done)

    def closing_lines(self) -> list[str]:
        rev = self.last_commit
        if rev is None:  # nothing committed: the branch's head already holds the set
            info = self._call(
                "reading the repo", self.api.repo_info, self.target.repo_id, repo_type="dataset",
                revision=self.target.revision,
            )  # fmt: skip
            rev = info.sha
        pinned = self.target.url(rev)
        return [f"revision {rev}: train from it with python -m adapter_trainer 'data.shards=[{pinned}]'"]

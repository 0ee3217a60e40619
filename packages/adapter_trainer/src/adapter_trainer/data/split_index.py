"""The split index: where each clip of a split lives, read from the set's `index.safetensors` sidecar.

The sidecar is checked against the manifest's size and sha256 like a tar; no tar is opened. `SplitIndex` keeps a few
dozen bytes per clip and `ClipReader` seeks to one clip's members: random access, so resume is one integer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from adapter_trainer.data.remote.cache import RemoteShard, ShardCache
from adapter_trainer.data.remote.urls import join
from adapter_trainer.data.sample_keys import MAX_KEY_LEN, shard_path_problem
from adapter_trainer.data.shards import SHA256_HEX, ShardFormatError, ShardSet, verify_files


@dataclass(frozen=True)
class SplitIndex:
    """Where each clip of one split lives, across shard sets (data.shards order, shard order, tar order)."""

    shard_paths: tuple[str, ...]  # tar paths or URLs (ShardEntry.location); `shard` below indexes into this
    shard: np.ndarray  # [N] int32
    codes_offset: np.ndarray  # [N] int64 byte offset of <key>.codes.npy's payload in its tar
    codes_size: np.ndarray  # [N] int32 payload bytes
    json_offset: np.ndarray  # [N] int64
    json_size: np.ndarray  # [N] int32
    keys: np.ndarray  # [N] fixed-width bytes (ytid, ASCII)
    weight: np.ndarray  # [N] float64 each clip's sample `weight` (1.0 when it has none)
    caption_digest: np.ndarray  # [N] uint64 digest of the caption (docs/shard-format.md)
    aspects_digest: np.ndarray  # [N] uint64 digest of the aspects joined with ", "
    n_codebooks: int  # K, for the decode checks
    codebook_size: int  # C
    # per shard: where a remote set's tar is fetched from (None: a local file); empty when every set is local
    shard_remote: tuple[RemoteShard | None, ...] = ()
    cache: ShardCache | None = None  # the remote tars' local cache (data.cache)
    code_counts: np.ndarray | None = None  # [K, C] int64 code counts of every clip of the split (all sets, all clips)

    def remote(self, shard: int) -> RemoteShard | None:
        return self.shard_remote[shard] if self.shard_remote else None

    def open_shard(self, shard: int) -> BinaryIO:
        """A read handle of shard `shard` (a remote one held in the cache until closed)."""
        r = self.remote(shard)
        if r is None or self.cache is None:
            return open(self.shard_paths[shard], "rb")
        return self.cache.open(r, what=f"shard {r.path or r.url}")

    def __len__(self) -> int:
        return int(self.shard.shape[0])

    def key(self, i: int) -> str:
        return self.keys[i].decode("ascii")

    def nbytes(self) -> int:
        """Resident bytes of the per-clip arrays (the part that grows with the corpus)."""
        return sum(
            a.nbytes
            for a in (self.shard, self.codes_offset, self.codes_size, self.json_offset, self.json_size, self.keys)
        )


_COLUMNS = ("keys", "codes_offset", "codes_size", "json_offset", "json_size", "weight", "caption_digest",
            "aspects_digest")  # fmt: skip


def build_index(sets: list[ShardSet], split: str, *, max_clips: int = 0, sha256: bool = False) -> SplitIndex:
    """Index `split` across `sets` from their sidecars (files checked against the manifest, keys unique across
    sets; payloads are checked when read); max_clips > 0 keeps the first N clips."""
    paths: list[str] = []
    remotes: list[RemoteShard | None] = []
    shard_cache: ShardCache | None = None
    parts: list[dict[str, np.ndarray]] = []
    counts_parts: list[np.ndarray] = []
    n = 0
    for s in sets:
        verify_files(s, split, sha256=sha256)
        side = read_set_index(s, split)
        entries = s.splits[split]
        rows = np.repeat(np.arange(len(entries)), [e.n_samples for e in entries])  # [n] shard within the set
        keep = len(rows) if not max_clips else max(0, min(len(rows), max_clips - n))
        used = int(rows[keep - 1]) + 1 if keep else 0
        part = {k: side[k][:keep] for k in _COLUMNS}
        part["shard"] = (len(paths) + rows[:keep]).astype(np.int32)
        for entry in entries[:used]:
            paths.append(entry.location)
            remotes.append(entry.remote)
            shard_cache = shard_cache or entry.cache
        if keep == len(rows):
            counts_parts.append(side["code_counts"])
        parts.append(part)
        n += keep
    empty = {"keys": np.zeros(0, "S1"), "caption_digest": np.zeros(0, np.uint64), "aspects_digest": np.zeros(0, np.uint64),
             "weight": np.zeros(0, np.float64)}  # fmt: skip
    cols = {k: np.concatenate([p[k] for p in parts]) if parts else empty.get(k, np.zeros(0, np.int64))
            for k in (*_COLUMNS, "shard")}  # fmt: skip
    if parts:
        uniq, counts = np.unique(cols["keys"], return_counts=True)
        if (counts > 1).any():
            dup = uniq[counts > 1][0].decode("ascii")
            where = sorted({paths[int(i)] for i in cols["shard"][cols["keys"] == uniq[counts > 1][0]]})
            raise ShardFormatError(
                f"sample key {dup!r} appears more than once ({', '.join(where)}); keys must be "
                f"unique across data.shards (the same set listed twice?)"
            )
    return SplitIndex(
        shard_paths=tuple(paths),
        shard=cols["shard"].astype(np.int32),
        **{k: cols[k] for k in _COLUMNS},
        n_codebooks=sets[0].n_codebooks,
        codebook_size=sets[0].codebook_size,
        shard_remote=tuple(remotes) if any(r is not None for r in remotes) else (),
        cache=shard_cache,
        code_counts=np.sum(counts_parts, axis=0) if sets and len(counts_parts) == len(sets) else None,
    )


INDEX_TENSORS = ("key", "codes_offset", "codes_size", "json_offset", "json_size", "weight", "caption_digest",
                 "aspects_digest", "code_counts")  # fmt: skip
INDEX_DTYPES = {"codes_offset": np.int64, "codes_size": np.int32, "json_offset": np.int64, "json_size": np.int32,
                "weight": np.float64, "caption_digest": np.uint64, "aspects_digest": np.uint64,
                "code_counts": np.int64}  # fmt: skip
_KEY_BYTES = np.zeros(256, dtype=bool)  # the bytes a key may hold (A-Z a-z 0-9 _ -), for a vectorised key check
for _c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-":
    _KEY_BYTES[_c] = True


def index_entry(s: ShardSet, split: str) -> dict:
    """The manifest's `splits.<split>.index`, checked for its path, size and sha256."""
    entry = dict(s.manifest.get("splits", {}).get(split) or {}).get("index")
    fix = "regenerate the set with python -m tokenizer_pipeline, or check it with python -m tokenizer_pipeline.verify"
    want = f"{split}/index.safetensors"
    if not isinstance(entry, dict) or entry.get("path") != want:
        raise ShardFormatError(f"{s.manifest_path}: split {split!r} lists no index {want!r}; {fix}")
    sha, size = entry.get("sha256"), entry.get("bytes")
    if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha) or not isinstance(size, int) or size < 0:
        raise ShardFormatError(f"{s.manifest_path}: split {split!r} index has sha256={sha!r}, bytes={size!r}; {fix}")
    return entry


def read_index_bytes(s: ShardSet, entry: dict) -> bytes:
    """The sidecar's bytes, checked against the manifest's size and sha256."""
    rel = str(entry["path"])
    where = join(str(s.root), rel) if s.is_remote else str(s.root / rel)  # type: ignore[operator]
    fix = f"re-copy the set, or rewrite it with python -m tokenizer_pipeline (its manifest: {s.manifest_path})"
    if s.is_remote:
        return _remote_index_bytes(s, entry, where)
    problem = shard_path_problem(s.root, rel)  # type: ignore[arg-type]
    if problem:
        raise ShardFormatError(f"{s.manifest_path}: index path {rel!r} {problem}; refusing the set")
    try:
        data = (s.root / rel).read_bytes()  # type: ignore[operator]
    except OSError as e:
        raise ShardFormatError(f"{where}: listed in {s.manifest_path} but not readable ({e}); {fix}") from e
    if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ShardFormatError(f"{where}: size or sha256 differs from {s.manifest_path} (corrupt or replaced); {fix}")
    return data


def _remote_index_bytes(s: ShardSet, entry: dict, where: str) -> bytes:
    """A remote set's sidecar: the shard cache's kept copy, else fetched once per node under the download lock of
    its sha256, checked, and kept while data.cache.max_bytes has room."""
    from adapter_trainer.data.remote.retry import with_retries
    from adapter_trainer.data.remote.urls import filesystem

    sha, size = entry["sha256"], entry["bytes"]
    cache = next((e.cache for entries in s.splits.values() for e in entries if e.cache is not None), None)

    def fetch() -> bytes:
        fs, path = filesystem(where)
        data = with_retries(lambda: fs.cat_file(path), what=f"index {entry['path']}", url=where,
                            tries=cache.tries if cache is not None else 5)  # fmt: skip
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            raise ShardFormatError(
                f"{where}: {len(data)} bytes with another sha256 than {s.manifest_path} lists; the copy at the URL is "
                f"corrupt or was replaced after the manifest: re-push the set with python -m tokenizer_pipeline.push"
            )
        return data

    if cache is None:
        return fetch()
    keep = cache.index_path(sha)

    def kept() -> bytes | None:
        try:
            data = keep.read_bytes()
        except FileNotFoundError:  # never kept, or evicted by another process of the node
            return None
        return data if len(data) == size and hashlib.sha256(data).hexdigest() == sha else None

    data = kept()
    if data is not None:
        return data
    with cache.download_lock(sha):  # one download per node; the other ranks wait here, then read the node's copy
        data = kept()
        if data is None:
            data = fetch()
            cache.keep_index(sha, data)
    return data


def read_set_index(s: ShardSet, split: str) -> dict[str, np.ndarray]:
    """A set's index of `split` as build_index's columns plus code_counts [K, C], checked: one row per sample the
    manifest lists, keys by the key rule."""
    entry = index_entry(s, split)
    from safetensors import SafetensorError
    from safetensors.numpy import load

    rel = entry["path"]
    data = read_index_bytes(s, entry)
    where = f"{s.root}/{rel}"
    fix = "regenerate the set with python -m tokenizer_pipeline (python -m tokenizer_pipeline.verify names the problem)"
    try:
        t = load(data)
    except (SafetensorError, ValueError) as e:
        raise ShardFormatError(f"{where}: not a readable index ({e}); {fix}") from e
    n = sum(e.n_samples for e in s.splits[split])
    missing = [k for k in INDEX_TENSORS if k not in t]
    if missing:
        raise ShardFormatError(f"{where}: index lacks {missing}; {fix}")
    key = t["key"]
    bad_shape = [k for k in INDEX_TENSORS[1:-1] if t[k].shape != (n,)]
    if key.dtype != np.uint8 or key.ndim != 2 or key.shape[0] != n or not 1 <= key.shape[1] <= MAX_KEY_LEN or bad_shape:
        raise ShardFormatError(
            f"{where}: index columns do not hold one row per sample of the {n} {s.manifest_path} lists for split "
            f"{split!r} ({', '.join(bad_shape) or 'key'}); {fix}"
        )
    if t["code_counts"].shape != (s.n_codebooks, s.codebook_size):
        raise ShardFormatError(f"{where}: code_counts has shape {t['code_counts'].shape}, expected "
                               f"({s.n_codebooks}, {s.codebook_size}); {fix}")  # fmt: skip
    # the key rule on every key at once: allowed bytes, then zero padding only, never empty
    filled = key != 0
    if n and (
        not (_KEY_BYTES[key] | ~filled).all()
        or not filled[:, 0].all()
        or (np.diff(filled.astype(np.int8), axis=1) > 0).any()
    ):
        raise ShardFormatError(f"{where}: an index key breaks the key rule (1-{MAX_KEY_LEN} of A-Z a-z 0-9 _ -); {fix}")
    columns = {k: t[k].astype(dtype) for k, dtype in INDEX_DTYPES.items()}
    return {"keys": np.ascontiguousarray(key).view(f"S{key.shape[1]}").reshape(n), **columns}

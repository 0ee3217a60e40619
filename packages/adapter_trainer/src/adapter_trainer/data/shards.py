"""A shard set as its manifest promises it (docs/shard-format.md), checked at startup.

`read_manifest` parses `<root>/manifest.json` of a directory or a URL (a remote set's tars are read through a verified
local cache), `check_compatible` refuses sets that disagree with each other or with the audio LM, `verify_files`
checks the listed tars and `open_tar` opens one. `ShardFormatError` is the error of the whole contract.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from adapter_trainer.data.remote.cache import RemoteShard, ShardCache
from adapter_trainer.data.remote.retry import with_retries
from adapter_trainer.data.remote.urls import filesystem, is_url, join, local_path
from adapter_trainer.data.sample_keys import shard_path_problem
from adapter_trainer.errors import UserError
from adapter_trainer.hydra_cli import override_word

FORMAT_NAME = "musiccaps-encodec-shards"
FORMAT_VERSION = 5  # the one version this trainer reads (docs/shard-format.md)
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class ShardFormatError(UserError, ValueError):
    """A shard set breaks docs/shard-format.md or does not fit the model; the message names the file and fix."""


@dataclass(frozen=True)
class ShardEntry:
    """One tar of a split, as the manifest lists it."""

    path: str  # relative to the shard-set directory, e.g. "train/shard-000000.tar" (the manifest's value)
    n_samples: int  # samples (clips) in the tar
    bytes: int  # tar file size
    sha256: str  # of the tar file's bytes
    tar: Path  # root / path: the file this process reads (a remote set's: the cache file named by sha256)
    remote: RemoteShard | None = None  # where a remote set's tar is fetched from (None: a local set)
    cache: ShardCache | None = field(default=None, compare=False, repr=False)

    @property
    def location(self) -> str:
        """The tar as the user knows it: its path, or its URL."""
        return self.remote.url if self.remote is not None else str(self.tar)


@dataclass(frozen=True)
class ShardSet:
    """One shard-set directory, as promised by its manifest.json."""

    root: Path | str  # the directory, or the URL (a Hub revision pinned to its commit)
    manifest_path: Path | str  # <root>/manifest.json
    manifest_sha256: str  # sha256 of manifest.json's bytes: the data identity stored in checkpoints
    n_codebooks: int  # K
    codebook_size: int  # C
    frame_rate: float  # code frames per second
    splits: dict[str, tuple[ShardEntry, ...]]
    manifest: dict = field(default_factory=dict, compare=False, repr=False)  # the parsed manifest.json

    @property
    def is_remote(self) -> bool:
        return isinstance(self.root, str)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _require(manifest: dict, dotted: str, where: Path | str) -> object:
    node: object = manifest
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ShardFormatError(
                f"{where}: missing field '{dotted}' (docs/shard-format.md); regenerate the set with "
                f"`python -m tokenizer_pipeline` and check it with `python -m tokenizer_pipeline.verify "
                f"{str(where).rsplit('/', 1)[0]}`"
            )
        node = node[part]
    return node


def _read_remote_manifest(url: str, tries: int) -> bytes:
    """`<url>/manifest.json`'s bytes (retried); a set without one is refused like a directory without one."""
    mpath = join(url, "manifest.json")
    fs, path = filesystem(mpath)

    def read() -> bytes | None:
        try:
            return fs.cat_file(path)
        except FileNotFoundError:
            return None

    raw = with_retries(read, what="the manifest", url=mpath, tries=tries)
    if raw is None:
        raise ShardFormatError(
            f"{mpath} not found: {url} is not a complete shard set (the manifest is pushed last). Push one with "
            f"`python -m tokenizer_pipeline.push SET {url}` or point data.shards at an existing set"
        )
    return raw


def local_set_problem(root: str | Path) -> str | None:
    """Why the local path `root` (as data.shards gives it) is no shard set, in one line naming the fix; None when it
    holds a manifest. A relative path is shown with the directory it is relative to."""
    given = str(root)
    path = Path(local_path(given)).expanduser()
    shown = given if path.is_absolute() else f"{given} (relative to the current directory {Path.cwd()})"
    if path.is_file():
        return (
            f"data.shards entry {shown} is a file, not a shard set: point data.shards at the directory stage 1 wrote "
            f"(its out_dir, holding manifest.json)"
        )
    if not path.exists():
        return (
            f"data.shards entry {shown} does not exist: point data.shards at a shard set, or write one there with "
            f"python -m tokenizer_pipeline {override_word('out_dir', str(path))} (or make demo-shards for "
            f"build/demo/shards)"
        )
    if (path / "manifest.json").is_file():
        return None
    if (path / ".progress").is_dir():
        return (
            f"data.shards entry {shown} is a shard set stage 1 has not finished (no manifest.json yet; the manifest is "
            f"written last): rerun the tokenizer_pipeline command that writes it, which encodes only what is missing"
        )
    return (
        f"data.shards entry {shown} holds no manifest.json, so it is no shard set: point data.shards at the directory "
        f"stage 1 wrote, or write one with python -m tokenizer_pipeline {override_word('out_dir', str(path))}"
    )


def manifest_bytes(root: str | Path, *, tries: int = 5) -> tuple[str, bytes]:
    """(where, bytes) of `<root>/manifest.json`, a directory or a URL (pin a Hub revision first)."""
    if is_url(str(root)):
        return join(str(root).rstrip("/"), "manifest.json"), _read_remote_manifest(str(root).rstrip("/"), tries)
    problem = local_set_problem(root)
    if problem:
        raise ShardFormatError(problem)
    mpath = Path(local_path(str(root))).expanduser().resolve() / "manifest.json"
    return str(mpath), mpath.read_bytes()


def read_manifest(root: str | Path, cache: ShardCache | None = None, *, tries: int = 5) -> ShardSet:
    """Parse and check `<root>/manifest.json` (a directory, or a URL with its Hub revision pinned). A remote set's
    tars are read through `cache` (a ShardCache under the user's cache directory when None)."""
    remote = is_url(str(root))
    where, raw = manifest_bytes(root, tries=tries)
    mpath: Path | str = where if remote else Path(where)
    root = str(root).rstrip("/") if remote else Path(where).parent
    if remote and cache is None:
        from adapter_trainer.data.remote.cache import default_cache_dir

        cache = ShardCache(default_cache_dir(), tries=tries)
    try:
        manifest = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ShardFormatError(f"{mpath}: not valid JSON ({e}); regenerate the shard set") from e
    fmt = _require(manifest, "format", mpath)
    if fmt != FORMAT_NAME:
        raise ShardFormatError(
            f"{mpath}: format={fmt!r}, expected {FORMAT_NAME!r}; data.shards must list "
            f"directories written by tokenizer_pipeline"
        )
    version = _require(manifest, "format_version", mpath)
    if version != FORMAT_VERSION:
        raise ShardFormatError(
            f"{mpath}: shard set {root} has format_version {version!r}; this trainer reads version {FORMAT_VERSION} "
            f"only: rebuild it with `python -m tokenizer_pipeline out_dir={root} overwrite=true` (or `make shards`)"
        )
    splits: dict[str, tuple[ShardEntry, ...]] = {}
    for name, split in dict(_require(manifest, "splits", mpath)).items():  # type: ignore[arg-type]
        entries = []
        for s in split.get("shards", []):
            # a remote set's paths are checked against a stand-in root: they never leave the set
            problem = shard_path_problem(Path("/set") if remote else root, s["path"])  # type: ignore[arg-type]
            if problem:
                raise ShardFormatError(
                    f"{mpath}: shard path {s['path']!r} {problem}; refusing the set (docs/shard-format.md)"
                )
            n, size, sha = int(s["n_samples"]), int(s["bytes"]), str(s["sha256"])
            if not SHA256_HEX.fullmatch(sha) or size < 0:
                # the sha256 names cache files: anything but 64 hex digits could name a path outside them
                raise ShardFormatError(
                    f"{mpath}: shard {s['path']!r} has sha256={sha!r}, bytes={size}: a sha256 is 64 lowercase hex "
                    f"digits and a size >= 0 (docs/shard-format.md); regenerate the set or fix its manifest"
                )
            if remote:
                assert cache is not None
                shard = RemoteShard(join(str(root), str(s["path"])), sha, size, str(s["path"]))
                entries.append(ShardEntry(str(s["path"]), n, size, sha, cache.path(sha), shard, cache))
            else:
                entries.append(ShardEntry(str(s["path"]), n, size, sha, root / Path(s["path"])))  # type: ignore[operator]
        splits[name] = tuple(entries)
    return ShardSet(
        root=root,
        manifest_path=mpath,
        manifest_sha256=hashlib.sha256(raw).hexdigest(),
        n_codebooks=int(_require(manifest, "codec.n_codebooks", mpath)),  # type: ignore[arg-type]
        codebook_size=int(_require(manifest, "codec.codebook_size", mpath)),  # type: ignore[arg-type]
        frame_rate=float(_require(manifest, "codec.frame_rate", mpath)),  # type: ignore[arg-type]
        splits=splits,
        manifest=manifest,
    )


def check_compatible(
    sets: list[ShardSet], *, model_n_codebooks: int, model_codebook_size: int, audio_lm: str = "the audio LM"
) -> None:
    """Refuse sets that disagree with each other or the audio LM (n_codebooks, codebook_size, frame_rate), or whose
    codecs have different weights (`codec.weights_sha256`: same shape, another meaning)."""
    if not sets:
        raise ShardFormatError("no shard sets given; set 'data.shards=[path/to/shard-set]'")
    first = sets[0]
    hashed = [s for s in sets if _weights_sha256(s) is not None]
    for other in hashed[1:]:
        a, b = _weights_sha256(hashed[0]), _weights_sha256(other)
        if a != b:
            raise ShardFormatError(
                f"data.shards mixes codes of two codecs: {hashed[0].root} was encoded with {_codec_name(hashed[0])} "
                f"(weights sha256 {str(a)[:12]}...) but {other.root} with {_codec_name(other)} (weights sha256 "
                f"{str(b)[:12]}...), so one code means two sounds; re-encode one set with the other's codec "
                f"(python -m tokenizer_pipeline codec.name_or_path=... out_dir=...) or train on one of them"
            )
    for other in sets[1:]:
        for attr in ("n_codebooks", "codebook_size", "frame_rate"):
            a, b = getattr(first, attr), getattr(other, attr)
            if a != b:
                raise ShardFormatError(
                    f"shard sets disagree on codec.{attr}: {a} in {first.manifest_path} but {b} in "
                    f"{other.manifest_path}. Codes from different codecs cannot be mixed; list only sets made "
                    f"with the same codec in data.shards"
                )
    for attr, want in (("n_codebooks", model_n_codebooks), ("codebook_size", model_codebook_size)):
        have = getattr(first, attr)
        if have != want:
            raise ShardFormatError(
                f"shards have codec.{attr}={have} ({', '.join(str(s.manifest_path) for s in sets)}) but the "
                f"audio LM {audio_lm} expects {want}. Re-encode the audio with the codec that matches the "
                f"MusicGen model (e.g. facebook/encodec_32khz for facebook/musicgen-small), or set "
                f"model.audio_lm to a decoder with {attr}={have}"
            )


def _weights_sha256(s: ShardSet) -> str | None:
    codec = s.manifest.get("codec")
    value = codec.get("weights_sha256") if isinstance(codec, dict) else None
    return value if isinstance(value, str) and value else None


def _codec_name(s: ShardSet) -> str:
    codec = s.manifest.get("codec")
    return str(codec.get("name_or_path", "an unnamed codec")) if isinstance(codec, dict) else "an unnamed codec"


def codec_notes(sets: list[ShardSet]) -> list[str]:
    """One note per set of a mixture whose manifest records no `codec.weights_sha256` (mixed on trust)."""
    if len(sets) < 2:
        return []
    return [
        f"note: {s.manifest_path} records no codec.weights_sha256, so its codec cannot be compared with the other "
        f"sets'; mixed on trust (same K, C and frame rate). Re-encode it with tokenizer_pipeline to have it checked"
        for s in sets
        if _weights_sha256(s) is None
    ]


def verify_files(shard_set: ShardSet, split: str, *, sha256: bool = False) -> None:
    """Every shard listed for `split` exists with the listed size (and sha256 if asked)."""
    if split not in shard_set.splits:
        raise ShardFormatError(
            f"{shard_set.manifest_path}: no split {split!r} (has: {', '.join(sorted(shard_set.splits)) or 'none'}); "
            f"set data.train_split / data.eval_split"
        )
    for entry in shard_set.splits[split]:
        if entry.remote is not None:
            continue  # fetched into the cache only after its size and sha256 match (data.remote.cache)
        if not entry.tar.is_file():
            raise ShardFormatError(
                f"{entry.tar} is listed in {shard_set.manifest_path} but missing; regenerate or re-copy the shard set"
            )
        size = entry.tar.stat().st_size
        if size != entry.bytes:
            raise ShardFormatError(
                f"{entry.tar}: {size} bytes, but {shard_set.manifest_path} lists {entry.bytes}; "
                f"the file is truncated or replaced; regenerate or re-copy the shard set"
            )
        if sha256 and sha256_file(entry.tar) != entry.sha256:
            raise ShardFormatError(
                f"{entry.tar}: sha256 differs from {shard_set.manifest_path}; the file is "
                f"corrupt or replaced; regenerate or re-copy the shard set"
            )


def open_tar(entry: ShardEntry) -> BinaryIO:
    """A read handle of the entry's tar (a remote set's verified cache copy, held against eviction until closed)."""
    if entry.remote is None or entry.cache is None:
        return open(entry.tar, "rb")
    return entry.cache.open(entry.remote, what=f"shard {entry.path}")


def open_shard_sets(
    paths: list[str],
    *,
    model_n_codebooks: int,
    model_codebook_size: int,
    audio_lm: str = "the audio LM",
    cache: ShardCache | None = None,
    tries: int = 5,
) -> list[ShardSet]:
    """read_manifest for every path + check_compatible; the startup check the recipe runs. `cache` serves the
    remote sets among them (pin Hub revisions before: data.remote.urls.pin)."""
    sets = [read_manifest(p, cache, tries=tries) for p in paths]
    check_compatible(
        sets, model_n_codebooks=model_n_codebooks, model_codebook_size=model_codebook_size, audio_lm=audio_lm
    )
    return sets

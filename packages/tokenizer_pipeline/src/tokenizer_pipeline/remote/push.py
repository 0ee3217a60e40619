"""`python -m tokenizer_pipeline.push SET URL`: copy a verified shard set to a directory, a bucket or a Hub dataset.

The tars go first and manifest.json last, so a reader never sees a manifest whose shards are not all there; a file
already there with the same content is skipped (a push resumes); a differing manifest is an update, its changes printed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .destinations import BucketDestination, Destination, DirectoryDestination
from .local_set import MANIFEST, SetFile, load_local_set
from .urls import RemoteError, filesystem, local_path, parse_hub, scheme_of

Print = Callable[[str], None]


def open_destination(url: str, *, private: bool = False, jobs: int = 4) -> Destination:
    """The destination a URL (or plain directory) names."""
    path = local_path(url)
    if path is not None:
        return DirectoryDestination(path, jobs=jobs)
    scheme = scheme_of(url)
    if scheme == "hf":
        from .hub import HubDestination  # huggingface_hub is imported only for hf:// URLs

        return HubDestination(parse_hub(url), private=private)
    if scheme in ("http", "https"):
        raise RemoteError(
            f"{url}: http(s):// is read-only here (verify reads it); push to s3://, gs://, hf:// or a directory"
        )
    fs, root = filesystem(url)
    return BucketDestination(url, fs, root, jobs=jobs)


CODEC_FIELDS = ("name_or_path", "n_codebooks", "codebook_size", "sampling_rate", "frame_rate", "weights_sha256")


def _split_change(name: str, a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    def text(s: dict[str, Any]) -> str:
        return f"{s.get('n_samples')} clips in {len(s.get('shards', []))} shards"

    if a is None or b is None:
        return [f"split {name}: {'added' if a is None else 'removed'} ({text(b or a or {})})"]
    old = {e.get("path"): e.get("sha256") for e in a.get("shards", [])}
    new = {e.get("path"): e.get("sha256") for e in b.get("shards", [])}
    rewritten = sum(1 for p, h in new.items() if p in old and old[p] != h)
    lines = [f"split {name}: {text(a)} -> {text(b)}"] if text(a) != text(b) else []
    if rewritten:
        lines.append(f"split {name}: {rewritten} shard(s) rewritten")
    return lines


def manifest_changes(old: bytes, new: dict[str, Any]) -> list[str]:
    """What replacing the destination's manifest `old` with `new` changes, one line each."""
    try:
        before = json.loads(old)
    except ValueError:
        before = None
    if not isinstance(before, dict):
        return ["the destination's manifest.json is not a manifest; it is replaced"]
    lines = []
    fmt = [f"{m.get('format')} v{m.get('format_version')}" for m in (before, new)]
    if fmt[0] != fmt[1]:
        lines.append(f"format: {fmt[0]} -> {fmt[1]}")
    ca, cb = before.get("codec") or {}, new.get("codec") or {}
    lines += [f"codec.{k}: {ca.get(k)} -> {cb.get(k)}" for k in CODEC_FIELDS if ca.get(k) != cb.get(k)]
    sa, sb = before.get("splits") or {}, new.get("splits") or {}
    for name in [*sa, *(n for n in sb if n not in sa)]:
        lines += _split_change(name, sa.get(name), sb.get(name))
    ta, tb = before.get("totals") or {}, new.get("totals") or {}
    lines += [
        f"totals.{k}: {ta.get(k)} -> {tb.get(k)}" for k in ("rows", "encoded", "failed") if ta.get(k) != tb.get(k)
    ]
    return lines or ["other fields (config, provenance) change"]


def push(set_dir: Path, url: str, *, private: bool = False, jobs: int = 4, out: Print = print) -> tuple[int, int]:
    """Push the set at `set_dir` to `url`; returns (files uploaded, files skipped)."""
    local = load_local_set(set_dir)
    dest = open_destination(url, private=private, jobs=jobs)
    final = dest.final_files(local)
    assert final[-1].rel == MANIFEST, "manifest.json is sent last: the commit point"
    dest.prepare()
    old = dest.read_manifest()
    if old is not None and old != local.manifest_bytes:
        out(f"{dest.url} holds another manifest.json: this push updates it (after every tar is there):")
        for line in manifest_changes(old, local.manifest):
            out(f"  {line}")
    present = dest.present([*local.shards, *final])
    counts = {"uploaded": 0, "skipped": 0, "bytes": 0}

    def skipped(f: SetFile) -> None:
        counts["skipped"] += 1
        out(f"skipped  {f.rel} (already at the destination, same sha256)")

    def uploaded(f: SetFile) -> None:
        counts["uploaded"] += 1
        counts["bytes"] += f.size
        out(f"uploaded {f.rel} ({f.size:,} bytes)")

    for f in local.shards:
        if f.rel in present:
            skipped(f)
    dest.upload_shards([f for f in local.shards if f.rel not in present], uploaded)
    for f in final:
        if f.rel in present:
            skipped(f)
    dest.upload_final([f for f in final if f.rel not in present], uploaded)
    out(
        f"pushed {set_dir} to {dest.url}: {counts['uploaded']} file(s) uploaded ({counts['bytes']:,} bytes), "
        f"{counts['skipped']} skipped"
    )
    for line in dest.closing_lines():
        out(line)
    return counts["uploaded"], counts["skipped"]

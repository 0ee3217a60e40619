"""Every problem of a shard set against docs/shard-format.md (`python -m tokenizer_pipeline.verify`).

Tars are read with plain `tarfile`, members only with safe decoders (`numpy.load(allow_pickle=False)`, strict
`json.loads`: NaN/Infinity are not JSON). A shard path that breaks the naming rule (`keys.py`) is never opened. A URL
is checked the same way, through a `fetch` that brings each file in just before it is read (`remote.fetch`).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .keys import KEY_RULE, key_problem, shard_path_problem
from .manifest import (
    CODES_MEMBER,
    FORMAT_NAME,
    FORMAT_VERSION,
    JSON_MEMBER,
    SampleRecord,
    SegmentSampleRecord,
    other_version_line,
)
from .split_index import ShardPart, assemble, shard_part
from .write_shards import sha256_file

JSON_FIELDS = set(SampleRecord.__dataclass_fields__)  # a MusicCaps clip
SEGMENT_JSON_FIELDS = set(SegmentSampleRecord.__dataclass_fields__)  # own-audio segments
SOURCE_KINDS = ("audiocraft", "audiofolder")
URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
EMPTY_SET = "the set holds 0 samples"  # the one problem of a well-formed set with nothing in it
Fetch = Callable[[str], None]  # brings the set's file `rel` into the root being checked (absent when it is missing)


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON (a number must be finite)")


def loads_strict(text: str | bytes) -> object:
    """json.loads that refuses NaN, Infinity and -Infinity (Python's json accepts them by default)."""
    return json.loads(text, parse_constant=_not_json)


def _check_sample(
    key: str, members: dict[str, bytes], n_codebooks: int, codebook_size: int, split: str
) -> tuple[list[str], int]:
    """Problems of one sample, and its n_frames (0 when unreadable)."""
    where = f"sample {key!r}"
    problems = []
    if set(members) != {CODES_MEMBER, JSON_MEMBER}:
        return [f"{where}: members {sorted(members)} != ['{CODES_MEMBER}', '{JSON_MEMBER}']"], 0
    try:
        codes = np.load(io.BytesIO(members[CODES_MEMBER]), allow_pickle=False)  # [T, K]
    except ValueError as e:
        return [f"{where}: {CODES_MEMBER} does not decode safely: {e}"], 0
    if codes.dtype != np.dtype("<i2") or codes.ndim != 2 or codes.shape[1] != n_codebooks:
        return [f"{where}: codes {codes.dtype} {codes.shape}, expected int16 [T, {n_codebooks}]"], 0
    if codes.size and (codes.min() < 0 or codes.max() >= codebook_size):
        problems.append(f"{where}: code values in [{codes.min()}, {codes.max()}], expected [0, {codebook_size})")
    try:
        meta = loads_strict(members[JSON_MEMBER].decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError, JSONDecodeError, NaN/Infinity
        return [*problems, f"{where}: json does not parse: {e}"], codes.shape[0]
    if not isinstance(meta, dict):
        return [*problems, f"{where}: json is not an object"], codes.shape[0]
    problems += _segment_problems(where, meta) if "source_kind" in meta else []
    missing = (SEGMENT_JSON_FIELDS if "source_kind" in meta else JSON_FIELDS) - set(meta)
    if missing:
        problems.append(f"{where}: json lacks fields {sorted(missing)}")
    if meta.get("ytid") != key:
        problems.append(f"{where}: json ytid {meta.get('ytid')!r} != key")
    if meta.get("n_frames") != codes.shape[0] or meta.get("n_codebooks") != codes.shape[1]:
        problems.append(
            f"{where}: json n_frames/n_codebooks {meta.get('n_frames')}/{meta.get('n_codebooks')} != codes {codes.shape}"
        )
    if meta.get("split") != split:
        problems.append(f"{where}: json split {meta.get('split')!r} != {split!r}")
    return problems, int(codes.shape[0])


def _segment_problems(where: str, meta: dict) -> list[str]:
    """A segment sample's own fields: its kind, weight, and key = <track_id>_<segment_index>."""
    problems = []
    if meta.get("source_kind") not in SOURCE_KINDS:
        problems.append(f"{where}: source_kind {meta.get('source_kind')!r} is not one of {SOURCE_KINDS}")
    w = meta.get("weight")
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0:
        problems.append(f"{where}: weight {w!r} must be a number > 0")
    if meta.get("ytid") != f"{meta.get('track_id')}_{meta.get('segment_index')}":
        problems.append(
            f"{where}: key is not <track_id>_<segment_index> ({meta.get('track_id')!r}, {meta.get('segment_index')!r})"
        )
    if not isinstance(meta.get("caption"), str) or not meta.get("caption"):
        problems.append(f"{where}: caption is empty (a track without one is a no_caption failure, never a sample)")
    return problems


def read_tar_samples(path: Path) -> tuple[list[tuple[str, dict[str, bytes]]], list[str]]:
    """Group a tar's regular members by key (text before the first '.'), in file order."""
    samples: dict[str, dict[str, bytes]] = {}
    problems = []
    with tarfile.open(path, "r:") as tar:
        for m in tar:
            if not m.isfile():
                problems.append(f"{path.name}: member {m.name!r} is not a regular file")
                continue
            if m.pax_headers:
                problems.append(f"{path.name}: member {m.name!r} has a PAX header; members are plain ustar entries")
            key, _, suffix = m.name.partition(".")
            problem = key_problem(key)
            if problem:
                problems.append(f"{path.name}: member {m.name!r}: key {problem} ({KEY_RULE})")
            f = tar.extractfile(m)
            assert f is not None
            if suffix in samples.setdefault(key, {}):
                problems.append(f"{path.name}: member {m.name!r} repeats")
            samples[key][suffix] = f.read()
    return list(samples.items()), problems


def verify(root: Path, fetch: Fetch | None = None) -> tuple[list[str], str]:
    """All problems found in the shard set at `root`, and a one-line summary.

    fetch: for a set read from a URL, called before each file is read (root is then a temporary directory, and each
    tar is deleted once checked); None for a directory.
    """
    mpath = root / "manifest.json"
    if fetch is not None:
        fetch("manifest.json")
    if not mpath.is_file():
        return [f"{mpath} missing: the set is incomplete (manifest.json is written last)"], ""
    try:
        m = loads_strict(mpath.read_text(encoding="utf-8"))
    except ValueError as e:
        return [f"{mpath}: not valid JSON ({e})"], ""
    if m.get("format") != FORMAT_NAME:
        return [f"{mpath}: format {m.get('format')!r}, expected {FORMAT_NAME!r}"], ""
    if m.get("format_version") != FORMAT_VERSION:
        return [other_version_line(mpath, m.get("format_version"))], ""
    try:
        return _verify_contents(root, m, fetch)
    except (KeyError, TypeError, AttributeError) as e:  # a field the format requires is absent or of another type
        return [
            f"{mpath}: a required field is missing or malformed ({type(e).__name__}: {e}); not a valid manifest"
        ], ""


def _verify_contents(root: Path, m: dict, fetch: Fetch | None = None) -> tuple[list[str], str]:
    """verify's checks of a manifest that parsed and has the right format/version (KeyError etc. on a bad shape)."""
    K, C = m["codec"]["n_codebooks"], m["codec"]["codebook_size"]
    problems: list[str] = []
    keys: set[str] = set()
    total_samples = total_frames = 0
    for split, s in m["splits"].items():
        split_samples = split_frames = 0
        parts: list[ShardPart] | None = []  # the index rows the tars give (None once a tar cannot give them)
        problem = key_problem(split)
        if problem:
            problems.append(f"split name {split!r} {problem} ({KEY_RULE}); its shards were not read")
            continue
        for i, e in enumerate(s["shards"]):
            if e["path"] != f"{split}/shard-{i:06d}.tar":
                problems.append(f"shard #{i} of {split} is named {e['path']!r}, expected {split}/shard-{i:06d}.tar")
            problem = shard_path_problem(root, e["path"])
            if problem:
                problems.append(f"shard path {e['path']!r} {problem}; not read")
                continue
            p = root / e["path"]
            if fetch is not None:
                try:
                    fetch(e["path"])
                except OSError as err:  # remote.RemoteError: retries spent, or refused (403)
                    problems.append(f"{e['path']}: not read: {err}")
                    continue
            if not p.is_file():
                problems.append(f"{e['path']}: listed in the manifest but missing")
                continue
            if p.stat().st_size != e["bytes"]:
                problems.append(f"{e['path']}: {p.stat().st_size} bytes, manifest says {e['bytes']}")
            if sha256_file(p) != e["sha256"]:
                problems.append(f"{e['path']}: sha256 differs from the manifest (corrupted or rewritten)")
            try:
                samples, tar_problems = read_tar_samples(p)
                if parts is not None:
                    try:
                        parts.append(shard_part(p, K, C))
                    except (ValueError, KeyError, TypeError):  # the sample checks below name what is wrong
                        parts = None
            except (tarfile.TarError, EOFError, OSError) as err:
                problems.append(f"{e['path']}: not a readable tar: {err}")
                parts = None
                continue
            finally:
                if fetch is not None:
                    p.unlink(missing_ok=True)  # a downloaded copy: the next tar needs the room
            problems += [f"{e['path']}: {t}" for t in tar_problems]
            if len(samples) != e["n_samples"]:
                problems.append(f"{e['path']}: {len(samples)} samples, manifest says {e['n_samples']}")
            for key, members in samples:
                if key in keys:
                    problems.append(f"{e['path']}: key {key!r} repeats within the set")
                keys.add(key)
                sample_problems, t = _check_sample(key, members, K, C, split)
                problems += [f"{e['path']}: {sp}" for sp in sample_problems]
                split_frames += t
            split_samples += len(samples)
        if split_samples != s["n_samples"] or split_frames != s["n_frames"]:
            problems.append(
                f"split {split}: {split_samples} samples/{split_frames} frames, manifest says {s['n_samples']}/{s['n_frames']}"
            )
        if parts is not None:
            problems += _index_problems(root, split, s.get("index"), parts, K, C, fetch)
        total_samples += split_samples
        total_frames += split_frames
    t = m["totals"]
    if fetch is not None:
        fetch("failures.jsonl")
    if t["encoded"] + t["failed"] != t["rows"] or t["encoded"] != total_samples or t["failed"] != len(m["failures"]):
        problems.append(f"totals {t} disagree with {total_samples} samples and {len(m['failures'])} failures")
    if not (root / "failures.jsonl").is_file():
        problems.append("failures.jsonl missing")
    elif len((root / "failures.jsonl").read_text(encoding="utf-8").splitlines()) != t["failed"]:
        problems.append(f"failures.jsonl does not have {t['failed']} lines")
    if (
        total_samples == 0 and not problems
    ):  # well-formed, but nothing to train on: a wrong audio_dir, every clip failed
        problems.append(
            f"{EMPTY_SET} ({t['failed']} of {t['rows']} rows failed: {root / 'failures.jsonl'} says why); "
            f"fix the input and rerun tokenizer_pipeline into it"
        )
    n_shards = sum(len(s["shards"]) for s in m["splits"].values())
    summary = f"OK {root}: {n_shards} shards, {total_samples} samples, {total_frames} frames, K={K}, C={C}, {t['failed']} failed rows"
    return problems, summary


def _index_problems(
    root: Path, split: str, entry: object, parts: list[ShardPart], K: int, C: int, fetch: Fetch | None
) -> list[str]:
    """A split's index sidecar against its tars: listed, there with its size and sha256, and byte for byte
    what the tars give (shards/split_index.py), with the manifest's summaries of it."""
    fix = "rerun the same python -m tokenizer_pipeline command into the set (it rewrites the index)"
    want = f"{split}/index.safetensors"
    if not isinstance(entry, dict) or entry.get("path") != want:
        return [f"split {split}: the manifest lists no index {want!r}; {fix}"]
    p = root / want
    if fetch is not None:
        try:
            fetch(want)
        except OSError as err:
            return [f"{want}: not read: {err}"]
    if not p.is_file():
        return [f"{want}: listed in the manifest but missing; {fix}"]
    data = p.read_bytes()
    if fetch is not None:
        p.unlink(missing_ok=True)
    problems = []
    if len(data) != entry.get("bytes") or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        problems.append(f"{want}: size or sha256 differs from the manifest (corrupted or rewritten); {fix}")
    expected, summary = assemble(parts, K, C)
    if data != expected:
        problems.append(
            f"{want}: does not match the tars of split {split} (keys, offsets, weights, digests or code counts); {fix}"
        )
    diff = [k for k, v in summary.items() if k not in ("bytes", "sha256") and entry.get(k) != v]
    if diff:
        problems.append(
            f"split {split}: the manifest's index summary disagrees with the tars on {', '.join(diff)}; {fix}"
        )
    return problems

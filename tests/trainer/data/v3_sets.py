"""Format-3 shard sets for the trainer tests, made without the pipeline's writer (the packages never share code):
a set written by tests/contract/shard_fixture.py is rewritten in place with the version-3 manifest fields and
optional sample fields of docs/shard-format.md (tarfile + json + hashlib only)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

SampleFields = Callable[[str, dict], dict[str, Any]]  # (key, sample json) -> fields to add or replace


def v3_sample_fields(key: str, meta: dict) -> dict[str, Any]:
    """The optional version-3 sample fields of an audiocraft-style segment, plus a field no version defines."""
    return {
        "source_kind": "audiocraft",
        "track_id": key,
        "source_path": f"music/{key}.wav",
        "segment_index": 0,
        "segment_start_s": 0.0,
        "segment_end_s": meta["duration_s"],
        "weight": 1.0,
        "metadata": {"genre": "test", "moods": ["calm"]},
        "field_from_the_future": {"ignored": True},
    }


def _rewrite_tar(path: Path, fields: SampleFields) -> None:
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for m, data in members:
            if m.name.endswith(".json"):
                meta = json.loads(data)
                meta.update(fields(m.name[: -len(".json")], meta))
                data = json.dumps(meta, sort_keys=True).encode()
                m.size = len(data)
            tar.addfile(m, io.BytesIO(data))


def make_v3(root: Path, fields: SampleFields = v3_sample_fields, *, version: int = 3) -> Path:
    """Rewrite the set at `root` as format `version`: every sample json gets `fields(key, meta)`, the manifest
    the version-3 fields (source.kind, source.sha256, segmentation) and the new tar sizes and hashes."""
    mpath = root / "manifest.json"
    manifest = json.loads(mpath.read_text())
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            tar = root / shard["path"]
            _rewrite_tar(tar, fields)
            data = tar.read_bytes()
            shard.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest["format_version"] = version
    manifest["source"].update(kind="audiocraft", sha256="0" * 64)
    manifest["segmentation"] = {"seconds": 10.0, "hop_seconds": 10.0, "min_seconds": 1.0, "n_dropped_short": 0}
    manifest["a_manifest_field_from_the_future"] = 1
    mpath.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return root

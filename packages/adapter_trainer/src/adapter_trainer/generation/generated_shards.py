"""Write generated codes as a shard set in the contract format (docs/shard-format.md), from the trainer side.

The codec identity is copied verbatim from the source manifest (only `path_from_set` is re-based), so
`python -m tokenizer_pipeline.decode` finds the codec that made the training codes; a `generated` section says where
the codes came from. Member mtimes are a fixed integer: reruns are byte-identical and no member needs a PAX header.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import webdataset as wds

from adapter_trainer.data.sample_keys import KEY_RULE, key_problem
from adapter_trainer.data.shards import FORMAT_NAME, FORMAT_VERSION, ShardFormatError, sha256_file

SPLIT = "generated"  # the one split of a generated set
MAX_PER_SHARD = 256  # like the pipeline's shard.max_samples
PACKAGE_VERSION = "0.1.0"


@dataclass(frozen=True)
class GeneratedClip:
    key: str  # sample key, no '.' (e.g. "gen-0003-<source ytid>")
    caption: str  # the caption the codes were conditioned on ("" = unconditioned)
    aspects: list[str]  # the source clip's aspect_list ([] for free text)
    codes: np.ndarray  # [T, K] int16 raw codes
    source_key: str  # ytid of the eval clip the caption came from, "" for file / given captions
    csv_row: int  # the source clip's CSV row, 0 when there is none


def _npy_bytes(codes: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(codes.astype("<i2")), allow_pickle=False)
    return buf.getvalue()


def _sample_json(clip: GeneratedClip, frame_rate: float) -> bytes:
    """Every field of the contract's `<ytid>.json`; CSV-only fields get neutral values for generated clips."""
    T, K = clip.codes.shape
    record = {
        "ytid": clip.key,
        "start_s": 0.0,
        "end_s": T / frame_rate,
        "audioset_positive_labels": [],
        "aspect_list": list(clip.aspects),
        "caption": clip.caption,
        "author_id": -1,
        "is_balanced_subset": False,
        "is_audioset_eval": False,
        "split": SPLIT,
        "csv_row": clip.csv_row,
        "n_frames": T,
        "n_codebooks": K,
        "duration_s": T / frame_rate,
        "source_file": "",
        "source_sha256": "",
    }
    return json.dumps(record, ensure_ascii=False, allow_nan=False).encode("utf-8")


def _digest(text: str) -> int:
    """docs/shard-format.md#the-split-index: the first 8 bytes of BLAKE2b of the UTF-8 text, little-endian."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def _write_index(out: Path, entries: list[dict[str, Any]], clips: list[GeneratedClip], K: int, C: int) -> dict:
    """`<out>/generated/index.safetensors` from the written tars (docs/shard-format.md#the-split-index); returns the
    manifest's `index` entry."""
    from safetensors.numpy import save

    members: dict[str, tuple[int, int]] = {}  # member name -> (payload offset, size)
    for e in entries:
        with tarfile.open(out / e["path"], "r:") as tar:
            members |= {m.name: (m.offset_data, m.size) for m in tar}
    keys = [c.key.encode("ascii") for c in clips]
    width = max(map(len, keys), default=1)
    counts = np.zeros((K, C), np.int64)
    for c in clips:
        for k in range(K):
            counts[k] += np.bincount(c.codes[:, k].astype(np.int64), minlength=C)
    at = [(members[f"{c.key}.codes.npy"], members[f"{c.key}.json"]) for c in clips]
    tensors = {
        "key": np.array([list(k.ljust(width, b"\0")) for k in keys], np.uint8).reshape(len(keys), width),
        "codes_offset": np.array([a[0][0] for a in at], np.int64),
        "codes_size": np.array([a[0][1] for a in at], np.int64),
        "json_offset": np.array([a[1][0] for a in at], np.int64),
        "json_size": np.array([a[1][1] for a in at], np.int64),
        "weight": np.ones(len(clips), np.float64),  # generated samples carry no `weight`
        "caption_digest": np.array([_digest(c.caption) for c in clips], np.uint64),
        "aspects_digest": np.array([_digest(", ".join(c.aspects)) for c in clips], np.uint64),
        "code_counts": counts,  # [K, C]
    }
    data = save(tensors, metadata={"format": "musiccaps-encodec-shards-index/1"})
    rel = f"{SPLIT}/index.safetensors"
    (out / rel).write_bytes(data)
    return {
        "path": rel, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "n_samples": len(clips),
        "n_distinct_captions": len(set(tensors["caption_digest"].tolist())),
        "n_distinct_aspects": len(set(tensors["aspects_digest"].tolist())),
        "weight_min": 1.0, "weight_max": 1.0, "weight_sum": float(len(clips)),
    }  # fmt: skip


def _relocated_codec(codec: dict[str, Any], generated: dict[str, Any], out: Path) -> dict[str, Any]:
    """The source manifest's codec section, `path_from_set` re-based from the first source set (or adapter folder)
    to `out`, or dropped when unknown."""
    if not codec.get("path_from_set"):
        return codec
    sources = generated.get("source_shards") or ([generated["adapter"]] if generated.get("adapter") else [])
    if not sources:
        return {**codec, "path_from_set": None}
    codec_dir = (Path(sources[0]) / codec["path_from_set"]).resolve()
    return {**codec, "path_from_set": Path(os.path.relpath(codec_dir, out.resolve())).as_posix()}


def write_generated_set(
    out_dir: str | Path,
    clips: list[GeneratedClip],
    *,
    source_manifest: dict[str, Any],
    generated: dict[str, Any],
    config: dict[str, Any],
    overwrite: bool = False,
) -> Path:
    """Write `clips` as `<out_dir>/generated/shard-NNNNNN.tar` + failures.jsonl + manifest.json; returns out_dir.
    A non-empty out_dir (without overwrite), a bad key or codes that do not fit the codec are refused before anything
    is written or deleted."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ShardFormatError(
            f"{out} is not empty; pass generate.overwrite=true to replace it or choose another generate.out_dir"
        )
    codec = _relocated_codec(source_manifest["codec"], generated, out)
    K, C, frame_rate = int(codec["n_codebooks"]), int(codec["codebook_size"]), float(codec["frame_rate"])
    for clip in clips:
        problem = key_problem(clip.key)
        if problem:
            raise ShardFormatError(f"generated key {clip.key!r} {problem} ({KEY_RULE}; docs/shard-format.md)")
        c = clip.codes
        if c.ndim != 2 or c.shape[1] != K or c.shape[0] == 0 or int(c.min()) < 0 or int(c.max()) >= C:
            raise ShardFormatError(
                f"generated clip {clip.key}: codes {c.dtype} {c.shape} do not fit the codec "
                f"(int16 [T>0, {K}] in 0..{C - 1})"
            )
    if out.exists() and any(out.iterdir()):  # overwrite: only now that every clip passed the checks
        shutil.rmtree(out)
    (out / SPLIT).mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(0, len(clips), MAX_PER_SHARD):
        chunk = clips[i : i + MAX_PER_SHARD]
        rel = f"{SPLIT}/shard-{i // MAX_PER_SHARD:06d}.tar"
        tmp = out / f"{rel}.tmp"
        with tmp.open("wb") as f:
            # fixed metadata: deterministic bytes. mtime an int: tarfile writes a float mtime as a PAX header,
            # which the contract forbids (plain ustar members)
            writer = wds.TarWriter(f, mtime=0, user="", group="")
            for clip in chunk:
                writer.write(
                    {"__key__": clip.key, "codes.npy": _npy_bytes(clip.codes), "json": _sample_json(clip, frame_rate)}
                )
            writer.close()
        os.replace(tmp, out / rel)
        entries.append(
            {
                "path": rel,
                "n_samples": len(chunk),
                "bytes": (out / rel).stat().st_size,
                "sha256": sha256_file(out / rel),
            }
        )
    n_frames = int(sum(c.codes.shape[0] for c in clips))
    seconds = n_frames / frame_rate
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created_by": {"package": "adapter_trainer", "version": PACKAGE_VERSION},
        "codec": codec,  # verbatim: the decoder must be the codec that made the training codes
        "codes": source_manifest.get(
            "codes", {"member": "codes.npy", "dtype": "int16", "layout": "[T, K] frame-major"}
        ),
        "splits": {
            SPLIT: {
                "shards": entries,
                "n_samples": len(clips),
                "audio_seconds": seconds,
                "n_frames": n_frames,
                "index": _write_index(out, entries, clips, K, C),
            }
        },
        "totals": {
            "rows": len(clips),
            "encoded": len(clips),
            "failed": 0,
            "audio_seconds": seconds,
            "n_frames": n_frames,
        },
        "failures": [],
        "source": {"csv": "", "csv_sha256": "", "audio_dir": ""},
        "config": config,
        "generated": generated,
    }
    (out / "failures.jsonl").write_text("")
    tmp = out / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, out / "manifest.json")  # written last: its presence means the set is complete
    return out

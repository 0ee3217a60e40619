"""Write a shard set exactly per docs/shard-format.md with ONLY tarfile + numpy + json (no package code).

Used by tests/contract/test_trainer_side.py and reused by the trainer tests (tests/trainer/*), so the trainer is
always tested against the written contract, not against the pipeline's implementation of it.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

FORMAT = "musiccaps-encodec-shards"

# Captions of the synthetic "genres": each genre draws its codes from its own band of the codebook, so a model
# that reads the caption can predict the codes better than a caption-blind one (a learnable caption gain).
GENRES = (
    "a calm solo piano ballad with soft reverb",
    "loud distorted electric guitar rock with fast drums",
    "upbeat electronic dance music with a heavy kick",
    "a slow string quartet playing a sad melody",
)


def _add_member(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(payload))


def npy_bytes(codes: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, codes, allow_pickle=False)
    return buf.getvalue()


def sample_json(key: str, caption: str, codes: np.ndarray, split: str, row: int, frame_rate: float) -> dict:
    return {
        "ytid": key,
        "start_s": 30.0,
        "end_s": 40.0,
        "audioset_positive_labels": ["/m/04rlf"],
        "aspect_list": ["synthetic"],
        "caption": caption,
        "author_id": 1,
        "is_balanced_subset": False,
        "is_audioset_eval": split == "eval",
        "split": split,
        "csv_row": row,
        "n_frames": int(codes.shape[0]),
        "n_codebooks": int(codes.shape[1]),
        "duration_s": codes.shape[0] / frame_rate,
        "source_file": f"{key}.wav",
        "source_sha256": hashlib.sha256(key.encode()).hexdigest(),
    }


def synthetic_clips(
    n: int,
    *,
    n_codebooks: int = 4,
    codebook_size: int = 2048,
    frames: tuple[int, int] = (20, 40),
    seed: int = 0,
    prefix: str = "clip",
) -> list[tuple[str, str, np.ndarray]]:
    """n clips (key, caption, codes [T, K] int16) whose codes depend on the caption's genre."""
    rng = np.random.default_rng(seed)
    band = max(codebook_size // (2 * len(GENRES)), 1)
    out = []
    for i in range(n):
        g = int(rng.integers(len(GENRES)))
        t = int(rng.integers(frames[0], frames[1] + 1))
        lo = g * 2 * band
        codes = lo + rng.integers(0, band, size=(t, n_codebooks))  # [T, K], genre band
        # every other frame repeats the previous one: a within-clip pattern the model can learn too
        codes[1::2] = codes[0:-1:2][: codes[1::2].shape[0]]
        key = f"{prefix}{i:07d}"[-11:].replace(".", "_")
        out.append((key, GENRES[g], (codes % codebook_size).astype(np.int16)))
    return out


def write_shard_set(
    root: Path,
    splits: dict[str, Sequence[tuple[str, str, np.ndarray]]],
    *,
    n_codebooks: int = 4,
    codebook_size: int = 2048,
    frame_rate: float = 50.0,
    format_name: str = FORMAT,
    format_version: int = 5,
    samples_per_shard: int = 16,
    extra_members: dict[str, bytes] | None = None,
    tar_format: int = tarfile.USTAR_FORMAT,
    weights: dict[str, float] | None = None,
) -> Path:
    """Write `root/{split}/shard-%06d.tar` + failures.jsonl + manifest.json (last). Returns root.

    Each split gets its index sidecar, listed in the manifest. weights: {key: sample `weight`} written into those
    samples' json (others have none).

    extra_members: {member name: bytes} appended to the FIRST shard of the first split (to plant bad members).
    tar_format: tarfile's format (PAX_FORMAT to plant keys whose member names need a long-name header).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    manifest_splits: dict = {}
    row = 2
    planted = False
    for split, clips in splits.items():
        (root / split).mkdir(exist_ok=True)
        shards = []
        n_frames_total = 0
        for s, start in enumerate(range(0, max(len(clips), 1), samples_per_shard)):
            chunk = clips[start : start + samples_per_shard]
            if not chunk:
                break
            rel = f"{split}/shard-{s:06d}.tar"
            path = root / rel
            with tarfile.open(path, "w", format=tar_format) as tar:
                for key, caption, codes in chunk:
                    _add_member(tar, f"{key}.codes.npy", npy_bytes(codes))
                    meta = sample_json(key, caption, codes, split, row, frame_rate)
                    if weights and key in weights:
                        meta["weight"] = weights[key]
                    _add_member(tar, f"{key}.json", json.dumps(meta, sort_keys=True).encode())
                    row += 1
                    n_frames_total += int(codes.shape[0])
                if extra_members and not planted:
                    for name, payload in extra_members.items():
                        _add_member(tar, name, payload)
                    planted = True
            data = path.read_bytes()
            shards.append(
                {"path": rel, "n_samples": len(chunk), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            )
        manifest_splits[split] = {
            "shards": shards,
            "n_samples": len(clips),
            "audio_seconds": n_frames_total / frame_rate,
            "n_frames": n_frames_total,
        }
        manifest_splits[split]["index"] = write_index(root, split, shards, n_codebooks, codebook_size)
    total = sum(len(c) for c in splits.values())
    (root / "failures.jsonl").write_text("")
    manifest = {
        "format": format_name,
        "format_version": format_version,
        "created_by": {"package": "tests/contract/shard_fixture.py", "version": "0"},
        "codec": {
            "name_or_path": "synthetic",
            "model_class": "EncodecModel",
            "sampling_rate": 32000,
            "frame_rate": frame_rate,
            "n_codebooks": n_codebooks,
            "codebook_size": codebook_size,
            "bandwidth_kbps": 2.2,
            "weights_sha256": "0" * 64,
            "dtype": "float32",
            "library_versions": {},
        },
        "codes": {"member": "codes.npy", "dtype": "int16", "layout": "[T, K] frame-major"},
        "splits": manifest_splits,
        "totals": {
            "rows": total,
            "encoded": total,
            "failed": 0,
            "audio_seconds": sum(v["audio_seconds"] for v in manifest_splits.values()),
            "n_frames": sum(v["n_frames"] for v in manifest_splits.values()),
        },
        "failures": [],
        "source": {"kind": "musiccaps", "csv": "synthetic.csv", "csv_sha256": "0" * 64, "audio_dir": "none"},
        "config": {},
    }
    tmp = root / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    tmp.replace(root / "manifest.json")
    return root


def text_digest(text: str) -> int:
    """docs/shard-format.md: the first 8 bytes of BLAKE2b-64 of the UTF-8 text, little-endian."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def write_index(root: Path, split: str, shards: list[dict], n_codebooks: int, codebook_size: int) -> dict:
    """`<split>/index.safetensors` per docs/shard-format.md, from the written tars; returns the manifest's
    `index` entry."""
    from safetensors.numpy import save

    rows, keys = [], []
    counts = np.zeros((n_codebooks, codebook_size), np.int64)
    for e in shards:
        with tarfile.open(root / e["path"]) as tar:
            members = {m.name: m for m in tar.getmembers()}
            for name, m in members.items():
                key, _, member = name.partition(".")
                if member != "json":
                    continue
                meta = json.loads(tar.extractfile(m).read())
                codes = np.load(io.BytesIO(tar.extractfile(members[f"{key}.codes.npy"]).read()))
                for k in range(n_codebooks):
                    counts[k] += np.bincount(codes[:, k].astype(np.int64), minlength=codebook_size)[:codebook_size]
                c = members[f"{key}.codes.npy"]
                keys.append(key.encode())
                rows.append((c.offset_data, c.size, m.offset_data, m.size, float(meta.get("weight", 1.0)),
                             text_digest(meta["caption"]), text_digest(", ".join(meta["aspect_list"]))))  # fmt: skip
    width = max([len(k) for k in keys], default=1)
    cols = list(zip(*rows)) if rows else [()] * 7
    tensors = {
        "key": np.array([list(k.ljust(width, b"\0")) for k in keys], np.uint8).reshape(len(keys), width),
        **{name: np.array(col, dtype) for name, col, dtype in zip(
            ("codes_offset", "codes_size", "json_offset", "json_size", "weight", "caption_digest", "aspects_digest"),
            cols, (np.int64, np.int64, np.int64, np.int64, np.float64, np.uint64, np.uint64))},
        "code_counts": counts,
    }  # fmt: skip
    data = save(tensors, metadata={"format": "musiccaps-encodec-shards-index/1"})
    rel = f"{split}/index.safetensors"
    (root / rel).write_bytes(data)
    w = tensors["weight"]
    return {
        "path": rel, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "n_samples": len(keys),
        "n_distinct_captions": len(set(tensors["caption_digest"].tolist())),
        "n_distinct_aspects": len(set(tensors["aspects_digest"].tolist())),
        "weight_min": float(w.min()) if len(w) else 1.0, "weight_max": float(w.max()) if len(w) else 1.0,
        "weight_sum": float(w.sum()),
    }  # fmt: skip


def write_synthetic_set(
    root: Path,
    *,
    n_train: int = 64,
    n_eval: int = 16,
    n_codebooks: int = 4,
    codebook_size: int = 2048,
    frames: tuple[int, int] = (20, 40),
    seed: int = 0,
    **kwargs,
) -> Path:
    """A train + eval synthetic set (distinct keys) in one call."""
    train = synthetic_clips(
        n_train, n_codebooks=n_codebooks, codebook_size=codebook_size, frames=frames, seed=seed, prefix="tr"
    )
    evl = synthetic_clips(
        n_eval, n_codebooks=n_codebooks, codebook_size=codebook_size, frames=frames, seed=seed + 1, prefix="ev"
    )
    return write_shard_set(
        root, {"train": train, "eval": evl}, n_codebooks=n_codebooks, codebook_size=codebook_size, **kwargs
    )

"""The learning check's frozen baselines (MusicGen alone, the teacher with own and deranged captions), cached in
`<output_dir>/baselines/<key>.npz` so that a resumed run reads them instead of scoring them again.

key = sha256 over everything the figures depend on (model files, eval clips, manifests, window and derangement
settings, dtype, device type, batch size, ranks, library versions): a stale figure is never read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from adapter_trainer.data.shards import sha256_file
from adapter_trainer.data.split_index import SplitIndex
from adapter_trainer.evaluation.target_ce import TargetCE

log = logging.getLogger(__name__)
BASELINES = ("music_lm", "teacher_true", "teacher_shuf")  # HeldOutEval's attributes, each a TargetCE or None
FIELDS = ("sum_per_codebook", "count_per_codebook", "sum_per_example", "count_per_example", "sum_per_frame",
          "count_per_frame")  # fmt: skip


def files_sha256(model_dir: Path) -> str:
    """sha256 over every regular file of a model directory: each name and its content's sha256, sorted (hidden files
    left out)."""
    files = sorted(q for q in model_dir.iterdir() if q.is_file() and not q.name.startswith("."))
    return hashlib.sha256("".join(f"{p.name}\0{sha256_file(p)}\n" for p in files).encode()).hexdigest()


def eval_set_sha256(index: SplitIndex) -> str:
    """sha256 over the eval clips in scoring order: each one's key and text digests."""
    h = hashlib.sha256()
    for i in range(len(index)):
        h.update(index.key(i).encode() + b"\0")
    h.update(np.ascontiguousarray(index.caption_digest).tobytes())
    h.update(np.ascontiguousarray(index.aspects_digest).tobytes())
    return h.hexdigest()


def baseline_key(**identity: Any) -> str:
    """The cache key of a set of baselines: sha256 of `identity` as canonical JSON."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, allow_nan=False).encode()).hexdigest()


def save_baselines(path: Path, held_out: Any, identity: dict[str, Any]) -> None:
    """Write `held_out`'s baselines (BASELINES, each a TargetCE or None) and its teacher_status to `path`."""
    arrays: dict[str, np.ndarray] = {
        "identity": np.array(json.dumps(identity, sort_keys=True, allow_nan=False)),
        "teacher_status": np.array(held_out.teacher_status),
    }
    for name in BASELINES:
        ce = getattr(held_out, name)
        if ce is None:
            continue
        for f in FIELDS:
            if getattr(ce, f) is not None:
                arrays[f"{name}.{f}"] = np.asarray(getattr(ce, f))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def load_baselines(path: Path) -> dict[str, Any] | None:
    """{name: TargetCE or None for BASELINES, "teacher_status": str} from `path`; None when absent or unreadable."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            got: dict[str, Any] = {"teacher_status": str(z["teacher_status"])}
            for name in BASELINES:
                if f"{name}.sum_per_codebook" not in z.files:
                    got[name] = None
                    continue
                got[name] = TargetCE(**{f: z[f"{name}.{f}"] if f"{name}.{f}" in z.files else None for f in FIELDS})
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:  # truncated or foreign: scored again, rewritten
        log.warning("%s cannot be read (%s); the baselines are scored again and the file rewritten", path, e)
        return None
    return got

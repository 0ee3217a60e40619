"""Your own audio encoded again into an existing set: what the set in out_dir keeps, read from its `.progress/`
(never with overwrite=true, never for MusicCaps): its id root, every kept track's split (`KeptSplits`), and which
samples each shard holds (`kept_shards`) when keeping them redoes fewer shards than a fresh layout.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..config import PipelineConfig
from ..shards.write_shards import PlannedSample, ShardPlan, plan_shards
from ..sources.splits import KeptSplits, without_suffix
from .progress import FINGERPRINT_FILE, PROGRESS_DIR, ShardRecord


@dataclass(frozen=True)
class KeptSet:
    """What the set in out_dir fixes for a run that encodes the same source into it again."""

    root: Path | None = None  # audiocraft: the id root it recorded (`.progress/config.json`'s source_root)
    splits: KeptSplits = field(default_factory=KeptSplits)
    shards: dict[str, dict[int, list[str]]] = field(default_factory=dict)  # split -> shard index -> keys, in order


def _records(progress: Path, split: str) -> list[tuple[int, ShardRecord]]:
    """(shard index, record) of the split's shards, by index; a record that does not parse is left out."""
    name = re.compile(rf"{re.escape(split)}-shard-(\d{{6}})\.json")
    found = []
    for p in sorted(progress.iterdir()):
        m = name.fullmatch(p.name)
        if m is None:
            continue
        try:
            found.append((int(m.group(1)), ShardRecord.from_json(p.read_text(encoding="utf-8"))))
        except (OSError, KeyError, TypeError, ValueError):  # damaged or from an older version: its shard is redone
            continue
    return found


def read_kept(cfg: PipelineConfig) -> KeptSet | None:
    """What the set in out_dir keeps for this run of your own audio: None for MusicCaps or with overwrite=true (a fresh
    layout), an empty KeptSet when out_dir holds no run of this pipeline."""
    if cfg.source.kind == "musiccaps" or cfg.overwrite:
        return None
    progress = Path(cfg.out_dir) / PROGRESS_DIR
    try:
        fingerprint = json.loads((progress / FINGERPRINT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return KeptSet()
    root = fingerprint.get("source_root") if isinstance(fingerprint, dict) else None
    by_sha: dict[str, str] = {}
    by_file: dict[str, str] = {}
    shards: dict[str, dict[int, list[str]]] = {}
    for split in (cfg.split.train_name, cfg.split.eval_name):
        for index, rec in _records(progress, split):
            shards.setdefault(split, {})[index] = list(rec.inputs)
            failed = {f.ytid for f in rec.failures}
            for key, inputs in rec.inputs.items():
                if key in failed or not isinstance(inputs, list) or len(inputs) < 2:
                    continue
                source_file, sha = inputs[0], inputs[1]
                if isinstance(sha, str):
                    by_sha.setdefault(sha, split)
                if isinstance(source_file, str):
                    by_file.setdefault(source_file, split)
                    by_file.setdefault(without_suffix(source_file), split)
    return KeptSet(Path(root) if isinstance(root, str) else None, KeptSplits(by_sha, by_file), shards)


def _redone(plans: list[ShardPlan], kept: KeptSet) -> int:
    """How many of `plans` hold other samples than the set's shard of that number (progress.why_redo redoes them)."""
    return sum({r.ytid for r in p.rows} != set(kept.shards.get(p.split, {}).get(p.index, ())) for p in plans)


def _keeping(
    rows: Sequence[PlannedSample], split_names: Sequence[str], max_samples: int, kept: KeptSet
) -> list[ShardPlan]:
    """Each recorded shard keeps its samples still planned in its split (in their recorded order; a shard left empty
    is gone); the other samples, in source order, fill new shards of `max_samples` in the lowest free numbers; then
    the shards are numbered from 0 again."""
    plans = []
    for split in split_names:
        recorded = kept.shards.get(split, {})
        where = {key: (index, pos) for index, keys in recorded.items() for pos, key in enumerate(keys)}
        held: dict[int, list[tuple[int, PlannedSample]]] = {}
        new: list[PlannedSample] = []
        for row in (r for r in rows if r.split == split):
            if row.ytid in where:
                index, pos = where[row.ytid]
                held.setdefault(index, []).append((pos, row))
            else:
                new.append(row)
        groups = {index: [row for _, row in sorted(members, key=lambda m: m[0])] for index, members in held.items()}
        free = 0
        for start in range(0, len(new), max_samples):
            while free in groups:
                free += 1
            groups[free] = new[start : start + max_samples]
        plans += [ShardPlan(split, number, tuple(groups[index])) for number, index in enumerate(sorted(groups))]
    return plans


def kept_shards(
    rows: Sequence[PlannedSample], split_names: Sequence[str], max_samples: int, kept: KeptSet | None
) -> list[ShardPlan]:
    """The shards of a run into the set `kept` describes: `plan_shards`'s fresh layout, or the one keeping the set's
    shards (`_keeping`) when that redoes fewer shards."""
    fresh = plan_shards(rows, split_names, max_samples)  # also checks max_samples
    if kept is None or not kept.shards:
        return fresh
    keeping = _keeping(rows, split_names, max_samples, kept)
    return keeping if _redone(keeping, kept) < _redone(fresh, kept) else fresh

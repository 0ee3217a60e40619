"""The trainer reads shard format versions 1 to 4 (v3 = v2 + optional sample and manifest fields, which it ignores
unless it uses them: `weight`; v4 = v3 with your own audio split by the audio), and refuses a newer version clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adapter_trainer.data.clip_reader import ClipReader
from adapter_trainer.data.samples import load_split
from adapter_trainer.data.shards import ShardFormatError, open_shard_sets
from adapter_trainer.data.split_index import build_index
from tests.contract.shard_fixture import write_synthetic_set
from tests.trainer.data.v3_sets import make_v3


def _open(*roots: Path):
    return open_shard_sets([str(r) for r in roots], model_n_codebooks=4, model_codebook_size=2048)


def test_a_v3_set_reads_like_the_v2_set_it_was_made_from(tmp_path: Path) -> None:
    v2 = write_synthetic_set(tmp_path / "v2", n_train=5, n_eval=2, format_version=2, samples_per_shard=2)
    v3 = make_v3(write_synthetic_set(tmp_path / "v3", n_train=5, n_eval=2, format_version=2, samples_per_shard=2))
    assert [s.format_version for s in _open(v2)] == [2] and [s.format_version for s in _open(v3)] == [3]
    for split in ("train", "eval"):
        ref, got = load_split(_open(v2), split), load_split(_open(v3), split)
        assert [c.key for c in got] == [c.key for c in ref] and len(got) > 0
        assert all(a.caption == b.caption and a.aspects == b.aspects for a, b in zip(ref, got))
        assert all(np.array_equal(a.codes, b.codes) for a, b in zip(ref, got))
        index = build_index(_open(v3), split)  # the streaming reader: header index + random access
        reader = ClipReader(index)
        assert [reader.read(i).key for i in range(len(index))] == [c.key for c in ref]


def test_a_v4_set_reads_like_the_v3_set_it_was_made_from(tmp_path: Path) -> None:
    """Version 4 changed how the writer draws your own audio's splits (source.split_rule), not the samples."""
    v3 = make_v3(write_synthetic_set(tmp_path / "v3", n_train=5, n_eval=2, format_version=2, samples_per_shard=2))
    v4 = make_v3(write_synthetic_set(tmp_path / "v4", n_train=5, n_eval=2, format_version=2, samples_per_shard=2),
                 version=4)  # fmt: skip
    assert [s.format_version for s in _open(v4)] == [4]
    for split in ("train", "eval"):
        ref, got = load_split(_open(v3), split), load_split(_open(v4), split)
        assert [c.key for c in got] == [c.key for c in ref] and len(got) > 0
        assert all(np.array_equal(a.codes, b.codes) for a, b in zip(ref, got))


def test_an_unknown_future_version_is_refused_naming_the_manifest(tmp_path: Path) -> None:
    root = make_v3(write_synthetic_set(tmp_path / "v6", n_train=2, n_eval=1, format_version=2), version=6)
    with pytest.raises(ShardFormatError, match=r"format_version=6 is not supported .*supported: 1, 2, 3, 4, 5"):
        _open(root)

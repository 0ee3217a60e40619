"""Both packages apply one naming rule (docs/shard-format.md, keys and paths) from their own copies: they agree on
a grid of keys and shard paths, and the longest allowed key still gives plain ustar members (no PAX header)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

from adapter_trainer.data import sample_keys as trainer_rule
from tokenizer_pipeline.shards import keys as pipeline_rule
from tokenizer_pipeline.shards.write_shards import TAR_GROUP, TAR_MODE, TAR_MTIME, TAR_USER

KEYS = [
    "-0Gj8-vB1q4", "a", "A_b-9", "x" * 89, "x" * 90, "x" * 91, "x" * 100, "x" * 300, "", ".", "..", "a.b", "a/b",
    "/abs", "../x", "a b", "a+b", "ä", "a\\b", "a\x00b", "a\nb", "gen-0001-Zz9_", "~home", "a:b", "-", "_",
]  # fmt: skip
PATHS = [
    "train/shard-000000.tar", "eval/shard-000001.tar", "/etc/passwd", "../outside.tar", "train/../../x.tar",
    "", "train/./shard-000000.tar", "\\abs", "link/shard-000000.tar",
]  # fmt: skip


@pytest.mark.parametrize("key", KEYS)
def test_both_packages_agree_on_every_key(key: str) -> None:
    assert (pipeline_rule.key_problem(key) is None) == (trainer_rule.key_problem(key) is None)


def test_the_rule_itself() -> None:
    assert pipeline_rule.MAX_KEY_LEN == trainer_rule.MAX_KEY_LEN == 90
    ok = {k for k in KEYS if pipeline_rule.key_problem(k) is None}
    assert ok == {"-0Gj8-vB1q4", "a", "A_b-9", "x" * 89, "x" * 90, "gen-0001-Zz9_", "-", "_"}


def test_both_packages_agree_on_every_shard_path(tmp_path: Path) -> None:
    root = tmp_path / "set"
    (root / "train").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "link").symlink_to(tmp_path / "elsewhere")  # a directory inside the set pointing outside it
    verdicts = {p: pipeline_rule.shard_path_problem(root, p) is None for p in PATHS}
    assert verdicts == {p: trainer_rule.shard_path_problem(root, p) is None for p in PATHS}
    assert {p for p, ok in verdicts.items() if ok} == {
        "train/shard-000000.tar",
        "eval/shard-000001.tar",
        "train/./shard-000000.tar",
    }


def test_the_longest_key_gives_plain_ustar_members() -> None:
    """The bound is tight: a 90-character key's `<key>.codes.npy` fits the ustar name field, 91 needs PAX."""
    for n, pax in ((90, False), (91, True)):
        buf = io.BytesIO()
        w = wds.TarWriter(buf, user=TAR_USER, group=TAR_GROUP, mode=TAR_MODE, mtime=TAR_MTIME, encoder=False)
        w.write({"__key__": "k" * n, "codes.npy": np.zeros(1).tobytes(), "json": b"{}"})
        w.close()
        with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
            assert any(m.pax_headers for m in tar.getmembers()) == pax

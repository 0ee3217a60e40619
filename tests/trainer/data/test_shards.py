"""adapter_trainer.data.shards and .samples beyond the contract: manifest hygiene, sample/manifest consistency,
limits."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from adapter_trainer.data.samples import iter_clips, load_split
from adapter_trainer.data.shards import ShardFormatError, open_shard_sets, read_manifest
from tests.contract.shard_fixture import npy_bytes, sample_json, synthetic_clips, write_shard_set, write_synthetic_set


def _open(root: Path):
    return open_shard_sets([str(root)], model_n_codebooks=4, model_codebook_size=2048)


def _rewrite_manifest(root: Path, edit) -> None:
    m = json.loads((root / "manifest.json").read_text())
    edit(m)
    (root / "manifest.json").write_text(json.dumps(m))


def test_manifest_hash_identifies_the_data(tmp_path: Path) -> None:
    a = write_synthetic_set(tmp_path / "a", n_train=3, n_eval=2, seed=1)
    b = write_synthetic_set(tmp_path / "b", n_train=3, n_eval=2, seed=1)
    c = write_synthetic_set(tmp_path / "c", n_train=3, n_eval=2, seed=2)
    ha, hb, hc = (read_manifest(p).manifest_sha256 for p in (a, b, c))
    assert ha == hb  # same content, different place: same identity (checkpoints survive moving the set)
    assert ha != hc


def test_sample_count_must_match_the_manifest(tmp_path: Path) -> None:
    root = write_shard_set(tmp_path / "s", {"train": synthetic_clips(5)})
    _rewrite_manifest(root, lambda m: m["splits"]["train"]["shards"][0].update(n_samples=6))
    with pytest.raises(ShardFormatError, match="5 samples, but .* lists 6"):
        load_split(_open(root), "train")


def test_path_outside_the_set_is_refused(tmp_path: Path) -> None:
    root = write_shard_set(tmp_path / "s", {"train": synthetic_clips(2)})
    _rewrite_manifest(root, lambda m: m["splits"]["train"]["shards"][0].update(path="../../etc/x.tar"))
    with pytest.raises(ShardFormatError, match="shard path .* must stay inside the shard set"):
        read_manifest(root)


def test_missing_manifest_field_and_bad_json(tmp_path: Path) -> None:
    root = write_shard_set(tmp_path / "s", {"train": synthetic_clips(2)})
    _rewrite_manifest(root, lambda m: m["codec"].pop("frame_rate"))
    with pytest.raises(ShardFormatError, match="missing field 'codec.frame_rate'"):
        read_manifest(root)
    (root / "manifest.json").write_text("{not json")
    with pytest.raises(ShardFormatError, match="not valid JSON"):
        read_manifest(root)


def test_frame_rate_mismatch_between_sets(tmp_path: Path) -> None:
    a = write_synthetic_set(tmp_path / "a", n_train=2, n_eval=1, frame_rate=50.0)
    b = write_synthetic_set(tmp_path / "b", n_train=2, n_eval=1, frame_rate=75.0)
    with pytest.raises(ShardFormatError, match="frame_rate: 50.0 in .* but 75.0"):
        open_shard_sets([str(a), str(b)], model_n_codebooks=4, model_codebook_size=2048)


def _write_raw_shard(root: Path, members: list[tuple[str, bytes]]) -> None:
    """Replace train/shard-000000.tar with exactly `members` and fix size/count in the manifest."""
    shard = root / "train" / "shard-000000.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    _rewrite_manifest(root, lambda m: m["splits"]["train"]["shards"][0].update(bytes=shard.stat().st_size))


def test_sample_missing_its_json_or_with_inconsistent_json(tmp_path: Path) -> None:
    root = write_shard_set(tmp_path / "s", {"train": synthetic_clips(1)})
    codes = np.zeros((6, 4), dtype=np.int16)
    _write_raw_shard(root, [("k0000000001.codes.npy", npy_bytes(codes))])
    with pytest.raises(ShardFormatError, match=r"missing \['json'\]"):
        list(iter_clips(read_manifest(root), "train"))
    meta = sample_json("k0000000001", "cap", codes, "train", 2, 50.0)
    meta["n_frames"] = 7
    _write_raw_shard(
        root, [("k0000000001.codes.npy", npy_bytes(codes)), ("k0000000001.json", json.dumps(meta).encode())]
    )
    with pytest.raises(ShardFormatError, match="json disagrees"):
        list(iter_clips(read_manifest(root), "train"))


def test_directory_and_dotted_members_are_refused(tmp_path: Path) -> None:
    root = write_shard_set(tmp_path / "s", {"train": synthetic_clips(1)})
    codes = np.zeros((6, 4), dtype=np.int16)
    meta = json.dumps(sample_json("k0000000001", "cap", codes, "train", 2, 50.0)).encode()
    _write_raw_shard(
        root,
        [("k0000000001.codes.npy", npy_bytes(codes)), ("k0000000001.json", meta), ("k0000000001.extra.pickle", b"x")],
    )
    with pytest.raises(ShardFormatError, match="k0000000001.extra.pickle"):
        list(iter_clips(read_manifest(root), "train"))


def test_max_clips_spans_sets_in_order(tmp_path: Path) -> None:
    a = write_shard_set(tmp_path / "a", {"eval": synthetic_clips(3, prefix="aa")})
    b = write_shard_set(tmp_path / "b", {"eval": synthetic_clips(3, prefix="bb")})
    sets = open_shard_sets([str(a), str(b)], model_n_codebooks=4, model_codebook_size=2048)
    keys = [c.key for c in load_split(sets, "eval", max_clips=5)]
    assert keys == ["aa0000000", "aa0000001", "aa0000002", "bb0000000", "bb0000001"]
    assert len(load_split(sets, "eval", max_clips=0)) == 6


def test_empty_split_reads_as_empty(tmp_path: Path) -> None:
    root = write_shard_set(tmp_path / "s", {"train": synthetic_clips(2), "eval": []})
    assert load_split(_open(root), "eval") == []


def test_sets_encoded_by_two_codecs_are_refused(tmp_path: Path) -> None:
    a = write_synthetic_set(tmp_path / "demo-set", n_train=2, n_eval=1)
    b = write_synthetic_set(tmp_path / "real-set", n_train=2, n_eval=1, seed=3)
    _rewrite_manifest(a, lambda m: m["codec"].update(name_or_path="build/demo/codec", weights_sha256="a1" * 32))
    _rewrite_manifest(b, lambda m: m["codec"].update(name_or_path="facebook/encodec_32khz", weights_sha256="b2" * 32))
    # same K, C and frame rate: only the weights tell the codecs apart
    with pytest.raises(ShardFormatError) as e:
        open_shard_sets([str(a), str(b)], model_n_codebooks=4, model_codebook_size=2048)
    msg = str(e.value)
    assert "\n" not in msg and "demo-set" in msg and "real-set" in msg and "re-encode one set" in msg
    assert "build/demo/codec" in msg and "facebook/encodec_32khz" in msg and "a1a1a1" in msg and "b2b2b2" in msg
    assert open_shard_sets([str(a)], model_n_codebooks=4, model_codebook_size=2048)  # one set: nothing to mix


def test_a_set_without_weights_sha256_is_mixed_on_trust_with_a_note(tmp_path: Path) -> None:
    from adapter_trainer.data.shards import codec_notes

    a = write_synthetic_set(tmp_path / "a", n_train=2, n_eval=1)
    b = write_synthetic_set(tmp_path / "b", n_train=2, n_eval=1, seed=3)
    _rewrite_manifest(b, lambda m: m["codec"].pop("weights_sha256"))
    sets = open_shard_sets([str(a), str(b)], model_n_codebooks=4, model_codebook_size=2048)
    notes = codec_notes(sets)
    assert len(notes) == 1 and str(b / "manifest.json") in notes[0] and "on trust" in notes[0]
    assert codec_notes(sets[:1]) == [] and codec_notes(sets[1:]) == []

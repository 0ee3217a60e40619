"""Trainer side of the shard contract (docs/shard-format.md): shards written with tarfile + numpy + json only
(shard_fixture.py) are read by adapter_trainer.data (shards, samples, split_index); bad sets are refused with a
message; pickles never run."""

from __future__ import annotations

import json
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from adapter_trainer.data.samples import load_split
from adapter_trainer.data.shards import ShardFormatError, open_shard_sets, read_manifest, verify_files
from adapter_trainer.data.split_index import build_index
from tests.contract.shard_fixture import synthetic_clips, write_shard_set, write_synthetic_set


def test_round_trip_reads_every_clip_in_order(tmp_path: Path) -> None:
    train = synthetic_clips(40, seed=3, prefix="tr")
    evl = synthetic_clips(5, seed=4, prefix="ev")
    root = write_shard_set(tmp_path / "set", {"train": train, "eval": evl}, samples_per_shard=16)
    assert sorted(p.name for p in (root / "train").iterdir()) == [
        "index.safetensors",
        "shard-000000.tar",
        "shard-000001.tar",
        "shard-000002.tar",
    ]
    sets = open_shard_sets([str(root)], model_n_codebooks=4, model_codebook_size=2048)
    got = load_split(sets, "train", sha256=True)
    assert [c.key for c in got] == [k for k, _, _ in train]
    for clip, (_, caption, codes) in zip(got, train):
        assert clip.caption == caption
        assert clip.codes.dtype == np.int16 and clip.codes.shape == codes.shape
        np.testing.assert_array_equal(clip.codes, codes)
    assert [c.key for c in load_split(sets, "eval")] == [k for k, _, _ in evl]
    assert len(load_split(sets, "train", max_clips=7)) == 7
    assert sets[0].frame_rate == 50.0 and len(sets[0].manifest_sha256) == 64


def test_two_sets_concatenate_and_duplicate_keys_are_refused(tmp_path: Path) -> None:
    a = write_shard_set(tmp_path / "a", {"train": synthetic_clips(4, prefix="aa")})
    b = write_shard_set(tmp_path / "b", {"train": synthetic_clips(3, prefix="bb")})
    sets = open_shard_sets([str(a), str(b)], model_n_codebooks=4, model_codebook_size=2048)
    assert len(load_split(sets, "train")) == 7
    dup = open_shard_sets([str(a), str(a)], model_n_codebooks=4, model_codebook_size=2048)
    with pytest.raises(ShardFormatError, match="unique across data.shards"):
        load_split(dup, "train")


@pytest.mark.parametrize("version", [4, 6])
def test_another_format_version_is_refused_in_one_line_naming_the_rebuild(tmp_path: Path, version: int) -> None:
    root = write_synthetic_set(tmp_path / f"v{version}", n_train=2, n_eval=1, format_version=version)
    with pytest.raises(ShardFormatError) as e:
        read_manifest(root)
    msg = str(e.value)
    assert "\n" not in msg and str(root / "manifest.json") in msg and f"format_version {version}" in msg
    assert "reads version 5 only" in msg and "python -m tokenizer_pipeline" in msg


def test_wrong_format_name_is_refused(tmp_path: Path) -> None:
    root = write_synthetic_set(tmp_path / "x", n_train=2, n_eval=1, format_name="something-else")
    with pytest.raises(ShardFormatError, match="expected 'musiccaps-encodec-shards'"):
        read_manifest(root)


def test_a_path_that_is_no_set_says_what_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Missing (a relative path names the directory it is relative to), a file, stage 1 unfinished, no set at all."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "half" / ".progress").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "a-file").write_text("x")
    for root, says in (
        ("nope", f"nope (relative to the current directory {tmp_path}) does not exist"),
        (str(tmp_path / "a-file"), "is a file, not a shard set"),
        ("half", "is a shard set stage 1 has not finished (no manifest.json yet"),
        ("other", "holds no manifest.json, so it is no shard set"),
    ):
        with pytest.raises(ShardFormatError) as e:
            read_manifest(root)
        assert says in str(e.value), str(e.value)
        assert "\n" not in str(e.value)


def test_sets_with_different_codebooks_are_refused(tmp_path: Path) -> None:
    a = write_synthetic_set(tmp_path / "k4", n_train=2, n_eval=1, n_codebooks=4)
    b = write_synthetic_set(tmp_path / "k8", n_train=2, n_eval=1, n_codebooks=8)
    with pytest.raises(ShardFormatError) as e:
        open_shard_sets([str(a), str(b)], model_n_codebooks=4, model_codebook_size=2048)
    msg = str(e.value)
    assert "n_codebooks" in msg and "4" in msg and "8" in msg
    assert str(a / "manifest.json") in msg and str(b / "manifest.json") in msg


def test_sets_not_matching_the_model_are_refused_with_the_fix(tmp_path: Path) -> None:
    root = write_synthetic_set(tmp_path / "c1024", n_train=2, n_eval=1, codebook_size=1024)
    with pytest.raises(ShardFormatError) as e:
        open_shard_sets([str(root)], model_n_codebooks=4, model_codebook_size=2048, audio_lm="tiny-musicgen")
    msg = str(e.value)
    assert "codebook_size=1024" in msg and "2048" in msg and "tiny-musicgen" in msg
    assert str(root / "manifest.json") in msg and "model.audio_lm" in msg
    with pytest.raises(ShardFormatError, match="n_codebooks=4"):
        open_shard_sets(
            [str(write_synthetic_set(tmp_path / "k4", n_train=2, n_eval=1))],
            model_n_codebooks=8,
            model_codebook_size=2048,
        )


def test_truncated_or_corrupt_shard_is_refused(tmp_path: Path) -> None:
    root = write_synthetic_set(tmp_path / "s", n_train=4, n_eval=1)
    s = read_manifest(root)
    shard = root / "train" / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF  # same size, different bytes
    shard.write_bytes(bytes(data))
    verify_files(s, "train")  # size check alone passes
    with pytest.raises(ShardFormatError, match="sha256"):
        verify_files(s, "train", sha256=True)
    shard.write_bytes(bytes(data[:-512]))
    with pytest.raises(ShardFormatError, match="bytes"):
        verify_files(s, "train")
    with pytest.raises(ShardFormatError, match="no split 'dev'"):
        verify_files(s, "dev")


class _Payload:
    """Unpickling this calls Path.touch(marker): proof the pickle was executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_planted_pickle_member_is_refused_and_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    payload = pickle.dumps(_Payload(marker))
    pickle.loads(payload)  # sanity: the payload does fire when unpickled ...
    assert marker.exists()
    marker.unlink()  # ... so its absence below means the reader never unpickled it
    clips = synthetic_clips(3, prefix="pk")
    key = clips[0][0]
    root = write_shard_set(tmp_path / "evil", {"train": clips}, extra_members={f"{key}.pyd": payload})
    sets = open_shard_sets([str(root)], model_n_codebooks=4, model_codebook_size=2048)
    with pytest.raises(ShardFormatError) as e:
        load_split(sets, "train")
    assert f"{key}.pyd" in str(e.value) and "shard-000000.tar" in str(e.value)
    assert not marker.exists()


def test_planted_pickle_inside_npy_is_refused_and_not_executed(tmp_path: Path) -> None:
    """An object-dtype .npy embeds a pickle; np.load(allow_pickle=False) must refuse it."""
    marker = tmp_path / "PWNED"
    root = write_shard_set(tmp_path / "evil", {"train": synthetic_clips(2, prefix="np")})
    shard = root / "train" / "shard-000000.tar"
    # rebuild the shard with the first sample's codes.npy replaced by an object array holding the payload
    import io

    obj = np.empty(1, dtype=object)
    obj[0] = _Payload(marker)
    buf = io.BytesIO()
    np.save(buf, obj, allow_pickle=True)
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i, (m, data) in enumerate(members):
            if i == 0:
                data = buf.getvalue()
                m.size = len(data)
            tar.addfile(m, io.BytesIO(data))
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][0]["bytes"] = shard.stat().st_size
    (root / "manifest.json").write_text(json.dumps(manifest))
    sets = open_shard_sets([str(root)], model_n_codebooks=4, model_codebook_size=2048)
    with pytest.raises(ShardFormatError, match="does not decode safely"):
        load_split(sets, "train")
    assert not marker.exists()


def test_member_without_extension_is_refused(tmp_path: Path) -> None:
    """WebDataset silently skips names without a dot; the reader still refuses them."""
    root = write_shard_set(
        tmp_path / "odd", {"train": synthetic_clips(2, prefix="od")}, extra_members={"README": b"hello"}
    )
    sets = open_shard_sets([str(root)], model_n_codebooks=4, model_codebook_size=2048)
    with pytest.raises(ShardFormatError, match="'README'"):
        load_split(sets, "train")


def test_codes_with_wrong_dtype_or_range_are_refused(tmp_path: Path) -> None:
    bad = [("wd0000001", "x", np.zeros((5, 4), dtype=np.int32))]
    root = write_shard_set(tmp_path / "dt", {"train": bad})
    with pytest.raises(ShardFormatError, match="expected int16"):
        load_split(open_shard_sets([str(root)], model_n_codebooks=4, model_codebook_size=2048), "train")
    big = [("wr0000001", "x", np.full((5, 4), 3000, dtype=np.int16))]
    root = write_shard_set(tmp_path / "rg", {"train": big})
    with pytest.raises(ShardFormatError, match="outside 0..2047"):
        load_split(open_shard_sets([str(root)], model_n_codebooks=4, model_codebook_size=2048), "train")


@pytest.mark.parametrize("key", ["a+b", "a b", "x" * 91])
def test_keys_outside_the_rule_are_refused_naming_shard_and_member(tmp_path: Path, key: str) -> None:
    clips = [(key, "x", np.zeros((5, 4), dtype=np.int16))]
    root = write_shard_set(tmp_path / "k", {"train": clips}, tar_format=tarfile.PAX_FORMAT)
    sets = open_shard_sets([str(root)], model_n_codebooks=4, model_codebook_size=2048)
    with pytest.raises(ShardFormatError) as e:
        load_split(sets, "train")
    assert str(root / "train/shard-000000.tar") in str(e.value) and f"member '{key}.codes.npy'" in str(e.value)
    with pytest.raises(
        ShardFormatError, match=r"train/index.safetensors: (an index key breaks the key rule|index columns do not hold)"
    ):
        build_index(sets, "train")


@pytest.mark.parametrize("where", ["absolute", "dotdot", "symlink"])
def test_shard_paths_leaving_the_set_are_refused(tmp_path: Path, where: str) -> None:
    outside = write_shard_set(tmp_path / "other", {"train": synthetic_clips(2, prefix="ot")})
    root = write_shard_set(tmp_path / "set", {"train": synthetic_clips(2, prefix="in")})
    m = json.loads((root / "manifest.json").read_text())
    entry = m["splits"]["train"]["shards"][0]
    if where == "absolute":
        entry["path"] = str(outside / "train/shard-000000.tar")
    elif where == "dotdot":
        entry["path"] = "../other/train/shard-000000.tar"
    else:
        (root / "linked").symlink_to(outside / "train")
        entry["path"] = "linked/shard-000000.tar"
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardFormatError, match=f"shard path '{entry['path']}'"):
        read_manifest(root)


# ---- the index sidecar (docs/shard-format.md#the-split-index)


def _sets(*roots: Path):
    return open_shard_sets([str(r) for r in roots], model_n_codebooks=4, model_codebook_size=2048)


def _tar_columns(root: Path, split: str) -> dict[str, list]:
    """The index columns as the tars give them (tarfile's member offsets), in manifest shard order and tar order."""
    m = json.loads((root / "manifest.json").read_text())
    cols: dict[str, list] = {"keys": [], "codes_offset": [], "codes_size": [], "json_offset": [], "json_size": []}
    for e in m["splits"][split]["shards"]:
        with tarfile.open(root / e["path"]) as tar:
            members = {x.name: x for x in tar.getmembers()}
        for name, x in members.items():
            key, _, member = name.partition(".")
            if member == "json":
                c = members[f"{key}.codes.npy"]
                for col, v in zip(cols, (key.encode(), c.offset_data, c.size, x.offset_data, x.size)):
                    cols[col].append(v)
    return cols


@pytest.mark.parametrize("max_clips", [0, 1, 16, 17, 39, 100])
@pytest.mark.parametrize("n_sets", [1, 2])
def test_the_index_holds_what_the_tars_give_cut_at_max_clips(tmp_path: Path, max_clips: int, n_sets: int) -> None:
    """The sidecar's rows equal the tars' member offsets, also when cut at max_clips inside or between sets; the
    split's code counts are there only when every clip of every set is kept."""
    roots = [
        write_shard_set(tmp_path / f"s{i}", {"train": synthetic_clips(20 + i, seed=i, prefix=f"s{i}")})
        for i in range(n_sets)
    ]
    got = build_index(_sets(*roots), "train", max_clips=max_clips)
    want = {k: sum((_tar_columns(r, "train")[k] for r in roots), []) for k in _tar_columns(roots[0], "train")}
    n = len(want["keys"]) if not max_clips else min(max_clips, len(want["keys"]))
    assert len(got) == n
    for col, values in want.items():
        assert getattr(got, col).tolist() == values[:n], col
    assert (got.code_counts is not None) == (n == len(want["keys"]))


def test_indexed_texts_counts_and_weights_equal_what_the_tars_give(tmp_path: Path) -> None:
    """Distinct captions/aspects, the unigram baseline and per-sample weights come from the index and equal what the
    clips themselves give; a uniform set reads no weight."""
    from dataclasses import replace

    from adapter_trainer.data.mixture import sample_weights, split_spans
    from adapter_trainer.data.streaming import distinct_texts
    from adapter_trainer.evaluation.held_out import unigram_baseline

    clips = {"train": synthetic_clips(40, seed=5, prefix="tr"), "eval": synthetic_clips(3, seed=6, prefix="ev")}
    weights = {clips["train"][3][0]: 2.5, clips["train"][30][0]: 0.25}
    (weighted,) = _sets(write_shard_set(tmp_path / "w", clips, weights=weights))
    ix = build_index([weighted], "train")
    assert distinct_texts(ix, "caption") == len({c for _, c, _ in clips["train"]})
    assert distinct_texts(ix, "aspects") == 1  # the fixture's one aspect list
    read = unigram_baseline(replace(ix, code_counts=None), 4, 2048)  # from the clips' codes
    np.testing.assert_allclose(unigram_baseline(ix, 4, 2048), read)
    (w,) = sample_weights([weighted], ix, split_spans([weighted], "train", len(ix)), "train")
    assert w[3] == 2.5 and w[30] == 0.25 and (np.delete(w, [3, 30]) == 1.0).all()
    sets = _sets(write_shard_set(tmp_path / "u", clips))
    iu = build_index(sets, "train")
    assert sample_weights(sets, iu, split_spans(sets, "train", len(iu)), "train") == [None]


@pytest.mark.parametrize("damage", ["flipped", "missing", "unlisted", "fewer_rows", "bad_key", "escaping_path"])
def test_a_damaged_index_is_refused_naming_it(tmp_path: Path, damage: str) -> None:
    """An index that is not the manifest's (size/sha256), absent, unlisted, short of rows, holding a key that breaks
    the key rule or listed outside its split is refused with one ShardFormatError naming the file and the fix."""
    import hashlib

    from safetensors.numpy import load, save

    root = write_synthetic_set(tmp_path / "s", n_train=20, n_eval=2)
    ix = root / "train/index.safetensors"
    m = json.loads((root / "manifest.json").read_text())
    entry = m["splits"]["train"]["index"]

    def rewrite(t: dict) -> None:
        raw = save(t, metadata={"format": "musiccaps-encodec-shards-index/1"})
        ix.write_bytes(raw)
        entry.update(bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest())

    if damage == "flipped":
        raw = bytearray(ix.read_bytes())
        raw[-1] ^= 1
        ix.write_bytes(bytes(raw))
    elif damage == "missing":
        ix.unlink()
    elif damage == "unlisted":
        del m["splits"]["train"]["index"]
    elif damage == "fewer_rows":
        rewrite({k: (v if k == "code_counts" else v[:-1]) for k, v in load(ix.read_bytes()).items()})
    elif damage == "bad_key":
        t = load(ix.read_bytes())
        t["key"][2, 1] = ord(".")
        rewrite(t)
    else:
        entry["path"] = "../train/index.safetensors"
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardFormatError) as e:
        build_index(_sets(root), "train")
    msg = str(e.value)
    assert "index" in msg and ("manifest.json" in msg or str(ix) in msg) and "tokenizer_pipeline" in msg

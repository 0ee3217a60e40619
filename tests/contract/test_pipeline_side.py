"""Pipeline side of the contract: what `tokenizer_pipeline` writes, read back with ONLY tarfile + numpy + json
and checked line by line against docs/shard-format.md (no package code on the reading side)."""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tests.pipeline.helpers import make_corpus, make_tiny_codec, pipeline_config

JSON_TYPES = {
    "ytid": str, "start_s": float, "end_s": float, "audioset_positive_labels": list, "aspect_list": list,
    "caption": str, "author_id": int, "is_balanced_subset": bool, "is_audioset_eval": bool, "split": str,
    "csv_row": int, "n_frames": int, "n_codebooks": int, "duration_s": float, "source_file": str,
    "source_sha256": str,
}  # fmt: skip


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[dict[str, str]]]:
    from tokenizer_pipeline.run.pipeline import run_pipeline

    root = tmp_path_factory.mktemp("contract")
    codec = make_tiny_codec(root / "codec")
    csv_path, audio_dir, rows = make_corpus(root / "corpus", n_train=4, n_eval=3)
    (audio_dir / f"{rows[2]['ytid']}.wav").unlink()  # one failure to record
    res = run_pipeline(pipeline_config(csv_path, audio_dir, root / "set", codec), progress=False)
    assert res.exit_code == 0
    return root / "set", csv_path, rows


def _samples(tar_path: Path) -> tuple[list[str], dict[str, dict[str, bytes]], list[tarfile.TarInfo]]:
    order, samples, infos = [], {}, []
    with tarfile.open(tar_path, "r:") as tar:
        for m in tar:
            infos.append(m)
            key, _, member = m.name.partition(".")  # WebDataset: key = up to the first dot
            if key not in samples:
                order.append(key)
                samples[key] = {}
            samples[key][member] = tar.extractfile(m).read()
    return order, samples, infos


def test_layout_and_manifest(shard_set) -> None:
    root, csv_path, rows = shard_set
    m = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    # version 5 lists every split's index sidecar, MusicCaps sets included (their split: the CSV's column)
    assert m["format"] == "musiccaps-encodec-shards" and m["format_version"] == 5
    assert m["source"]["kind"] == "musiccaps" and m["segmentation"] is None  # v3: MusicCaps samples as in v2
    assert "split_rule" not in m["source"]
    assert m["created_by"] == {"package": "tokenizer_pipeline", "version": "0.1.0"}
    c = m["codec"]
    assert set(c) == {"name_or_path", "model_class", "sampling_rate", "frame_rate", "n_codebooks", "codebook_size",
                      "bandwidth_kbps", "weights_sha256", "dtype", "library_versions", "device", "num_threads",
                      "config", "path_from_set"}  # fmt: skip
    assert (
        c["model_class"] == "EncodecModel"
        and c["dtype"] == "float32"
        and re.fullmatch(r"[0-9a-f]{64}", c["weights_sha256"])
    )
    assert set(c["library_versions"]) == {"torch", "soxr", "transformers", "webdataset", "numpy"}
    assert c["device"] == "cpu" and isinstance(c["num_threads"], int) and c["num_threads"] >= 1
    assert c["config"]["use_causal_conv"] is False and c["config"]["pad_mode"] == "reflect"  # the tiny codec's config
    assert (root / c["path_from_set"]).resolve() == Path(c["name_or_path"]).resolve()  # found from any directory
    assert m["codes"] == {"member": "codes.npy", "dtype": "int16", "layout": "[T, K] frame-major"}
    assert set(m["splits"]) == {"train", "eval"}
    encoded = 0
    for split, s in m["splits"].items():
        assert s["n_samples"] == sum(e["n_samples"] for e in s["shards"])
        for i, e in enumerate(s["shards"]):
            assert e["path"] == f"{split}/shard-{i:06d}.tar"
            data = (root / e["path"]).read_bytes()
            assert e["bytes"] == len(data) and e["sha256"] == hashlib.sha256(data).hexdigest()
            assert len(_samples(root / e["path"])[0]) == e["n_samples"]
        encoded += s["n_samples"]
    t = m["totals"]
    assert (
        t["rows"] == 7 and t["encoded"] == encoded == 6 and t["failed"] == 1 and t["encoded"] + t["failed"] == t["rows"]
    )
    assert t["n_frames"] == sum(s["n_frames"] for s in m["splits"].values())
    f = m["failures"][0]
    assert m["failures"] == [{"ytid": rows[2]["ytid"], "csv_row": 4, "split": "eval", "reason": "missing_audio",
                              "detail": f["detail"], "error_type": None, "retryable": True}]  # fmt: skip
    assert "audio file not found" in f["detail"] and rows[2]["ytid"] in f["detail"]
    lines = (root / "failures.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == m["failures"]
    assert m["source"]["csv_sha256"] == hashlib.sha256(csv_path.read_bytes()).hexdigest()
    assert isinstance(m["config"], dict) and m["config"]["shard"]["max_samples"] == 2
    assert not re.search(r"20\d\d-\d\d-\d\d|timestamp|created_at", json.dumps(m))  # no timestamps


def test_samples(shard_set) -> None:
    root, csv_path, rows = shard_set
    m = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    K, C, fr = m["codec"]["n_codebooks"], m["codec"]["codebook_size"], m["codec"]["frame_rate"]
    by_id = {r["ytid"]: r for r in rows}
    with csv_path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        line_of = {}
        for r in reader:
            line_of[r["ytid"]] = reader.line_num  # single-line rows in this subset
    seen: list[str] = []
    for split, s in m["splits"].items():
        split_keys: list[str] = []
        for e in s["shards"]:
            order, samples, infos = _samples(root / e["path"])
            assert {(i.mtime, i.uid, i.gid, i.mode, i.uname, i.gname) for i in infos} == {
                (0, 0, 0, 0o444, "root", "root")
            }
            for key in order:
                assert "." not in key and re.fullmatch(r"[A-Za-z0-9_-]{11}", key)
                assert set(samples[key]) == {"codes.npy", "json"}  # exactly two members
                codes = np.load(io.BytesIO(samples[key]["codes.npy"]), allow_pickle=False)
                assert codes.dtype == np.dtype("<i2") and codes.ndim == 2 and codes.shape[1] == K
                assert codes.min() >= 0 and codes.max() < C
                meta = json.loads(samples[key]["json"].decode("utf-8"))
                assert set(meta) == set(JSON_TYPES)
                assert all(isinstance(meta[k], t) for k, t in JSON_TYPES.items()), meta
                row = by_id[key]
                assert meta["ytid"] == key and meta["split"] == split and meta["csv_row"] == line_of[key]
                assert meta["caption"] == row["caption"] and meta["author_id"] == int(row["author_id"])
                assert meta["audioset_positive_labels"] == row["audioset_positive_labels"].split(",")
                assert meta["aspect_list"] == ast.literal_eval(row["aspect_list"])
                assert meta["is_audioset_eval"] == (row["is_audioset_eval"] == "True") == (split == "eval")
                assert (meta["n_frames"], meta["n_codebooks"]) == codes.shape
                assert meta["n_frames"] == int(np.ceil(meta["duration_s"] * fr - 1e-9))
                assert meta["source_file"] == f"{key}.wav" and re.fullmatch(r"[0-9a-f]{64}", meta["source_sha256"])
                split_keys.append(key)
        # samples of a split are in CSV order
        assert split_keys == [
            r["ytid"]
            for r in rows
            if (r["is_audioset_eval"] == "True") == (split == "eval") and r["ytid"] in split_keys
        ]
        seen += split_keys
    assert len(seen) == len(set(seen)) == 6


def test_index_sidecar_matches_the_tars(shard_set) -> None:
    """Format 5: each split's index.safetensors, read with safetensors + tarfile + numpy + json only, holds per sample
    (tar order) its key, members' payload offsets and sizes, weight and text digests, and the split's code counts;
    the manifest lists it with its size, sha256 and summaries."""
    from safetensors.numpy import load

    root, _, _ = shard_set
    m = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    K, C = m["codec"]["n_codebooks"], m["codec"]["codebook_size"]

    def digest(text: str) -> int:
        return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")

    for split, s in m["splits"].items():
        ix = s["index"]
        raw = (root / ix["path"]).read_bytes()
        assert ix["path"] == f"{split}/index.safetensors"
        assert ix["bytes"] == len(raw) and ix["sha256"] == hashlib.sha256(raw).hexdigest()
        t = load(raw)
        keys, rows, counts, captions, aspects = [], [], np.zeros((K, C), np.int64), set(), set()
        for e in s["shards"]:
            order, samples, infos = _samples(root / e["path"])
            at = {i.name: (i.offset_data, i.size) for i in infos}
            for key in order:
                meta = json.loads(samples[key]["json"])
                codes = np.load(io.BytesIO(samples[key]["codes.npy"]), allow_pickle=False)
                for k in range(K):
                    counts[k] += np.bincount(codes[:, k], minlength=C)
                keys.append(key)
                rows.append((*at[f"{key}.codes.npy"], *at[f"{key}.json"], 1.0, digest(meta["caption"]),
                             digest(", ".join(meta["aspect_list"]))))  # fmt: skip
                captions.add(meta["caption"])
                aspects.add(", ".join(meta["aspect_list"]))
        assert [bytes(r).rstrip(b"\0").decode() for r in t["key"]] == keys and t["key"].dtype == np.uint8
        got = zip(t["codes_offset"], t["codes_size"], t["json_offset"], t["json_size"], t["weight"],
                  t["caption_digest"], t["aspects_digest"])  # fmt: skip
        assert [tuple(x.item() for x in r) for r in got] == rows
        np.testing.assert_array_equal(t["code_counts"], counts)
        assert (ix["n_samples"], ix["n_distinct_captions"], ix["n_distinct_aspects"]) == (
            len(keys), len(captions), len(aspects))  # fmt: skip
        assert (ix["weight_min"], ix["weight_max"], ix["weight_sum"]) == (1.0, 1.0, float(len(keys)))


@pytest.mark.parametrize("damage", ["missing", "other_bytes", "consistent_but_wrong", "unlisted"])
def test_verify_checks_the_index_against_the_tars(shard_set, tmp_path: Path, damage: str) -> None:
    """`verify` accepts the set as written and names the index when it is missing, is not the listed file, or is a
    well-formed sidecar (manifest updated to its sha256) whose rows disagree with the tars."""
    import shutil

    from safetensors.numpy import load, save

    from tokenizer_pipeline.shards.verify import verify

    root = shutil.copytree(shard_set[0], tmp_path / "set")
    assert verify(root)[0] == []
    m = json.loads((root / "manifest.json").read_text())
    ix = root / "train/index.safetensors"
    if damage == "missing":
        ix.unlink()
    elif damage == "other_bytes":
        ix.write_bytes((root / "eval/index.safetensors").read_bytes())
    elif damage == "consistent_but_wrong":
        t = load(ix.read_bytes())
        t["weight"][0] = 2.0
        raw = save(t, metadata={"format": "musiccaps-encodec-shards-index/1"})
        ix.write_bytes(raw)
        m["splits"]["train"]["index"] |= {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    else:
        m["splits"]["train"]["index"] = None
    (root / "manifest.json").write_text(json.dumps(m))
    problems = verify(root)[0]
    assert problems and all("train" in p and "index" in p for p in problems), problems
    if damage == "consistent_but_wrong":
        assert any("does not match the tars" in p for p in problems)


def test_verify_refuses_another_format_version_in_one_line_naming_the_rebuild(shard_set, tmp_path: Path) -> None:
    import shutil

    from tokenizer_pipeline.shards.verify import verify

    root = shutil.copytree(shard_set[0], tmp_path / "set")
    m = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps(m | {"format_version": 4}))
    (problem,) = verify(root)[0]
    assert str(root / "manifest.json") in problem and "format_version 4" in problem and "\n" not in problem
    assert "reads version 5 only" in problem and "python -m tokenizer_pipeline out_dir=" in problem

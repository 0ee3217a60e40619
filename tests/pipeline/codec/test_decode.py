"""codec/decode.py and shards/verify.py on shard sets that were tampered with: keys and paths are data, codes are checked against
the manifest, the codec is found from any directory and must match the manifest's weights and config."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tests.pipeline.helpers import make_corpus, pipeline_config
from tokenizer_pipeline.decode import main as decode_main
from tokenizer_pipeline.run.pipeline import run_pipeline
from tokenizer_pipeline.shards.verify import verify


@pytest.fixture()
def shard_set(built: Path, tmp_path: Path) -> Path:
    """A fresh copy of the built set per test (tests tamper with it)."""
    return Path(shutil.copytree(built, tmp_path / "set", ignore=shutil.ignore_patterns(".progress", ".lock")))


def _members(tar_path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(tar_path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]


def _rewrite(root: Path, rel: str, members: list[tuple[str, bytes]]) -> None:
    """Replace the shard's members and fix its size and sha256 in the manifest, as a tamperer would."""
    with tarfile.open(root / rel, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    m = json.loads((root / "manifest.json").read_text())
    for s in m["splits"].values():
        for e in s["shards"]:
            if e["path"] == rel:
                data = (root / rel).read_bytes()
                e["bytes"], e["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (root / "manifest.json").write_text(json.dumps(m, indent=2))


def _rename_first_sample(root: Path, new_key: str) -> str:
    rel = "train/shard-000000.tar"
    members = _members(root / rel)
    old = members[0][0].split(".")[0]
    _rewrite(root, rel, [(n.replace(old, new_key, 1) if n.startswith(old) else n, d) for n, d in members])
    return rel


def _decode(capsys, *args: str) -> tuple[int, str]:
    code = decode_main([str(a) for a in args])
    return code, capsys.readouterr().err


def _set_codes(root: Path, codes: np.ndarray) -> None:
    rel = "train/shard-000000.tar"
    members = _members(root / rel)
    buf = io.BytesIO()
    np.save(buf, codes, allow_pickle=False)
    _rewrite(root, rel, [(n, buf.getvalue() if n.endswith(".codes.npy") else d) for n, d in members])


# ---- keys and paths


@pytest.mark.parametrize("kind", ["absolute", "dotdot"])
def test_decode_refuses_member_names_that_are_paths_before_writing(shard_set: Path, tmp_path: Path, capsys, kind):
    evil = tmp_path / "elsewhere" / "evil"
    evil.parent.mkdir()
    key = str(evil) if kind == "absolute" else "../../elsewhere/evil"
    rel = _rename_first_sample(shard_set, key)
    out = tmp_path / "wav"
    code, err = _decode(capsys, shard_set, f"out_dir={out}")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{shard_set / rel}: member '{key}.codes.npy'" in err
    assert not out.exists() and not list(evil.parent.iterdir())  # nothing written anywhere


def test_decode_refuses_a_shard_path_outside_the_set(shard_set: Path, built: Path, tmp_path: Path, capsys) -> None:
    m = json.loads((shard_set / "manifest.json").read_text())
    m["splits"]["train"]["shards"][0]["path"] = str(built / "train/shard-000000.tar")  # same bytes, another place
    (shard_set / "manifest.json").write_text(json.dumps(m))
    code, err = _decode(capsys, shard_set, f"out_dir={tmp_path / 'wav'}")
    assert code == 2 and "is absolute" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "wav").exists()


def test_verify_fails_keys_and_paths_outside_the_rule(shard_set: Path, built: Path, tmp_path: Path) -> None:
    assert verify(shard_set)[0] == []
    _rename_first_sample(shard_set, "k" * 100)  # a 100-character key: the tar needs a PAX header for it
    problems, _ = verify(shard_set)
    assert any("more than 90" in p for p in problems) and any("PAX header" in p for p in problems)

    for path in (str(built / "train/shard-000000.tar"), "../set2/train/shard-000000.tar", "link/shard-000000.tar"):
        copy = Path(shutil.copytree(built, tmp_path / "c", dirs_exist_ok=True))
        (copy / "link").unlink(missing_ok=True)
        (copy / "link").symlink_to(built / "train")  # a directory link leaving the set
        m = json.loads((copy / "manifest.json").read_text())
        m["splits"]["train"]["shards"][0]["path"] = path
        (copy / "manifest.json").write_text(json.dumps(m))
        problems, _ = verify(copy)
        assert any(f"shard path {path!r}" in p for p in problems), (path, problems)


def test_verify_fails_sample_json_that_is_not_json(shard_set: Path) -> None:
    rel = "train/shard-000000.tar"
    members = _members(shard_set / rel)
    bad = [(n, d.replace(b'"start_s": 30.0', b'"start_s": NaN') if n.endswith(".json") else d) for n, d in members]
    assert bad != members
    _rewrite(shard_set, rel, bad)
    assert any("NaN is not JSON" in p for p in verify(shard_set)[0])


# ---- codes against the manifest


@pytest.mark.parametrize(
    "codes, want",
    [
        (np.full((20, 4), 64, np.int16), r"code values in \[64, 64\], the manifest's codec has codes 0..63"),
        (np.zeros((20, 5), np.int16), r"codes int16 \[20, 5\], the manifest's codec needs int16 \[T>0, 4\]"),
    ],
)
def test_decode_checks_codes_against_the_manifest(shard_set: Path, tmp_path: Path, capsys, codes, want) -> None:
    _set_codes(shard_set, codes)
    code, err = _decode(capsys, shard_set, f"out_dir={tmp_path / 'wav'}")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "train/shard-000000.tar: member " in err and ".codes.npy" in err
    assert __import__("re").search(want, err), err
    assert not (tmp_path / "wav").exists()


# ---- the codec: found from anywhere, identity = weights + config


def test_decode_finds_a_relative_codec_from_any_directory(tiny_codec: Path, tmp_path: Path, monkeypatch, capsys):
    work = tmp_path / "project"
    shutil.copytree(tiny_codec, work / "build/codec")
    csv_path, audio_dir, _ = make_corpus(work / "corpus", n_train=1, n_eval=1)
    monkeypatch.chdir(work)
    cfg = pipeline_config(csv_path, audio_dir, Path("build/shards"), Path("build/codec"))
    assert run_pipeline(cfg, progress=False).exit_code == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, err = _decode(capsys, work / "build/shards", "out_dir=wav")
    assert code == 0, err
    assert len(json.loads((elsewhere / "wav/decoded.json").read_text())["clips"]) == 2

    # the set and its codec copied side by side to another place: still found
    moved = tmp_path / "moved"
    shutil.copytree(work / "build", moved / "build")
    shutil.rmtree(work / "build")
    code, err = _decode(capsys, moved / "build/shards", "out_dir=wav2")
    assert code == 0, err
    # no codec anywhere: one line that names codec=
    shutil.rmtree(moved / "build/codec")
    code, err = _decode(capsys, moved / "build/shards", "out_dir=wav3")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "Pass codec=" in err and "build/codec" in err


def test_decode_refuses_a_codec_with_the_same_weights_but_another_config(
    shard_set: Path, tiny_codec: Path, tmp_path: Path, capsys
) -> None:
    other = Path(shutil.copytree(tiny_codec, tmp_path / "causal"))
    cfg = json.loads((other / "config.json").read_text())
    cfg.update(use_causal_conv=True, pad_mode="constant")  # same weights, other audio
    (other / "config.json").write_text(json.dumps(cfg))
    code, err = _decode(capsys, shard_set, f"out_dir={tmp_path / 'wav'}", f"codec={other}")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "pad_mode='constant' (manifest 'reflect')" in err and "use_causal_conv=True (manifest False)" in err
    assert not (tmp_path / "wav").exists()
    assert _decode(capsys, shard_set, f"out_dir={tmp_path / 'ok'}", f"codec={tiny_codec}")[0] == 0


@pytest.mark.parametrize("damage", ["missing", "truncated", "not_a_tar", "directory"])
def test_decode_refuses_an_unreadable_shard_in_one_line(shard_set: Path, tmp_path: Path, capsys, damage: str) -> None:
    """A shared set copied incompletely: the shard is named in one line (exit 2), no traceback, nothing written."""
    tar = shard_set / "train" / "shard-000000.tar"
    if damage == "missing":
        tar.unlink()
    elif damage == "truncated":
        tar.write_bytes(tar.read_bytes()[:1000])
    elif damage == "not_a_tar":
        tar.write_bytes(b"\x13" * 700)
    else:
        tar.unlink()
        tar.mkdir()
    out = tmp_path / "wav"
    code, err = _decode(capsys, shard_set, f"out_dir={out}")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(tar) in err and "verify" in err
    assert not out.exists()


@pytest.mark.parametrize("drop", ["codec", "splits"])
def test_decode_refuses_a_manifest_without_its_sections_in_one_line(
    shard_set: Path, tmp_path: Path, capsys, drop: str
) -> None:
    m = json.loads((shard_set / "manifest.json").read_text())
    del m[drop]
    (shard_set / "manifest.json").write_text(json.dumps(m))
    code, err = _decode(capsys, shard_set, f"out_dir={tmp_path / 'wav'}")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "manifest.json" in err and repr(drop) in err
    assert not (tmp_path / "wav").exists()


@pytest.mark.parametrize("drop", ["codec", "splits", "totals"])
def test_verify_reports_a_manifest_without_its_sections(shard_set: Path, drop: str) -> None:
    """verify's job is to report what is wrong: a manifest missing a section is a problem, not a KeyError."""
    m = json.loads((shard_set / "manifest.json").read_text())
    del m[drop]
    (shard_set / "manifest.json").write_text(json.dumps(m))
    problems, _ = verify(shard_set)
    assert len(problems) == 1 and "manifest.json" in problems[0] and repr(drop) in problems[0]


@pytest.mark.parametrize("arg", ["limit=-1", "max_seconds=-2", "max_seconds=nan", "max_seconds=inf"])
def test_decode_refuses_a_negative_limit_or_a_bad_max_seconds(shard_set: Path, tmp_path: Path, capsys, arg) -> None:
    """limit=-1 decoded one clip; max_seconds=nan/-2 silently meant 'whole clips'."""
    code, err = _decode(capsys, shard_set, f"out_dir={tmp_path / 'wav'}", arg)
    assert code == 2 and len(err.strip().splitlines()) == 1 and arg.split("=")[0] in err, err
    assert not (tmp_path / "wav").exists()

"""Own audio you can trust: split names checked for every source, track ids that survive a move, one bad
track is that track's failure, audiocraft's own rules for paths and metadata, dropped short audio named."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tests.pipeline.sources.helpers import (
    audiocraft_line,
    audiocraft_writer,
    failures,
    make_audiofolder,
    samples,
    source_config,
    write_manifest,
    write_track,
)
from tokenizer_pipeline.config import SegmentConfig, SourceConfig, SplitConfig
from tokenizer_pipeline.errors import PipelineError
from tokenizer_pipeline.run.pipeline import run_pipeline
from tokenizer_pipeline.shards.verify import verify
from tokenizer_pipeline.shards.write_shards import sha256_file
from tokenizer_pipeline.sources.plan import plan_items
from tokenizer_pipeline.sources.splits import audio_is_eval
from tokenizer_pipeline.sources.track_ids import sanitised

SHORT = SegmentConfig(seconds=0.5)


def tiny_tracks(folder: Path, names: list[str], seconds: float = 1.0) -> None:
    for i, name in enumerate(names):
        write_track(folder / name, seconds, sr=16000, channels=1, seed=i)
        (folder / name).with_suffix(".json").write_text(json.dumps({"description": f"song {name}"}))


def split_names_cfg(kind: str, tmp_path: Path, tiny_codec: Path, **split: str):
    if kind == "audiocraft":
        tiny_tracks(tmp_path / "music", ["a.wav"])
        where = audiocraft_writer(tmp_path / "music", tmp_path / "egs/data.jsonl")
    else:
        where = make_audiofolder(tmp_path / "folder", {"": [{"file_name": "a.wav", "caption": "x"}]}, seconds=1.0)
    return source_config(kind, where, tmp_path / "set", tiny_codec, segment=SHORT, split=SplitConfig(**split))


# --- item 1: split names ---


@pytest.mark.parametrize("kind", ["audiocraft", "audiofolder"])
@pytest.mark.parametrize(
    "split, match",
    [
        ({"train_name": "../escaped"}, r"split.train_name='../escaped' contains '\.', '/'"),
        ({"eval_name": "/tmp/anywhere"}, r"split.eval_name='/tmp/anywhere' contains '/'"),
        ({"train_name": ""}, r"split.train_name='' is empty"),
        ({"eval_name": ".."}, r"split.eval_name='\.\.' contains '\.'"),
        ({"train_name": "same", "eval_name": "same"}, r"must differ, both are 'same'"),
    ],
)
def test_split_names_are_checked_for_every_source_before_anything_is_written(
    tmp_path: Path, tiny_codec: Path, kind: str, split: dict, match: str
) -> None:
    cfg = split_names_cfg(kind, tmp_path, tiny_codec, **split)
    with pytest.raises(PipelineError, match=match) as e:
        run_pipeline(cfg, progress=False)
    assert "\n" not in str(e.value)  # one line, not an AssertionError traceback
    assert not (tmp_path / "set").exists() and not (tmp_path / "escaped").exists()


def test_an_escaping_split_name_with_overwrite_deletes_nothing_outside_out_dir(
    tmp_path: Path, tiny_codec: Path
) -> None:
    victim = tmp_path / "victim/shard-000000.tar"
    victim.parent.mkdir()
    victim.write_bytes(b"someone else's shard")
    cfg = replace(split_names_cfg("audiocraft", tmp_path, tiny_codec, train_name="../victim"), overwrite=True)
    (tmp_path / "set").mkdir()
    with pytest.raises(PipelineError, match="split.train_name"):
        run_pipeline(cfg, progress=False)
    assert victim.read_bytes() == b"someone else's shard"


# --- item 2: ids ---

CYRILLIC = [chr(0x430 + i % 32) + chr(0x430 + i // 32) + "песня.wav" for i in range(40)]


def test_the_same_files_at_two_locations_give_identical_keys_and_splits(tmp_path: Path, tiny_codec: Path) -> None:
    """40 files with Cyrillic names (they all used to become `track`, one split) copied to a second mount point, each
    listed by audiocraft's writer with absolute paths: the same ids and splits, no machine directory in a key."""
    names = [f"album {i // 10}/t{i}.wav" for i in range(40)] + [f"ru/{n}" for n in CYRILLIC]
    tiny_tracks(tmp_path / "home/me/music", names, seconds=0.1)
    shutil.copytree(tmp_path / "home/me/music", tmp_path / "mnt/data/music")
    plans, audio = [], {}
    for where in ("home/me/music", "mnt/data/music"):
        manifest = audiocraft_writer(tmp_path / where, tmp_path / f"{where}.jsonl")
        cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, split=SplitConfig(eval_fraction=0.5),
                            segment=SegmentConfig(seconds=0.1))  # fmt: skip
        items = plan_items(cfg)[0]
        plans.append({i.ytid: i.split for i in items})
        audio = {i.ytid: sha256_file(Path(i.audio_path)) for i in items}
    assert plans[0] == plans[1] and len(plans[0]) == 80
    assert not any("home" in k or "mnt" in k or "music" in k for k in plans[0])
    ru = [k for k in plans[0] if k.startswith("ru-")]  # "ru" + a hash of the exact path
    assert len(ru) == 40 and {plans[0][k] for k in ru} == {"train", "eval"}  # 40 ids, both splits drawn
    assert all((plans[0][k] == "eval") == audio_is_eval(audio[k], 0.5) for k in plans[0])  # by the audio


def test_a_moved_dataset_encodes_to_the_same_keys_and_splits(tmp_path: Path, tiny_codec: Path) -> None:
    tiny_tracks(tmp_path / "a/music", [f"t{i}.wav" for i in range(4)] + ["é.wav"])
    sets = []
    for where in ("a/music", "b/moved"):
        if where == "b/moved":
            shutil.move(tmp_path / "a", tmp_path / "b")
            (tmp_path / "b/music").rename(tmp_path / "b/moved")
        manifest = audiocraft_writer(tmp_path / where, tmp_path / f"{where}.jsonl")
        out = tmp_path / f"set-{where.replace('/', '-')}"
        cfg = source_config(
            "audiocraft", manifest, out, tiny_codec, split=SplitConfig(eval_fraction=0.5), segment=SHORT
        )
        assert run_pipeline(cfg, progress=False).exit_code == 0
        sets.append({k: (s["split"], s["source_file"], s["source_sha256"]) for k, s in samples(out).items()})
    assert sets[0] == sets[1] and len(sets[0]) == 10


def test_the_same_audio_under_two_paths_is_encoded_once(tmp_path: Path, tiny_codec: Path) -> None:
    """A copy (and a link) of one file under other names: whichever split their ids draw, only the first line is
    encoded; the others are duplicate_audio failures naming it, so no audio is in both splits."""
    tiny_tracks(tmp_path / "m", ["orig.wav", "other.wav"])
    shutil.copy(tmp_path / "m/orig.wav", tmp_path / "m/copy.wav")
    (tmp_path / "m/link.wav").symlink_to(tmp_path / "m/orig.wav")
    lines = [audiocraft_line(str(tmp_path / f"m/{n}.wav"), 1.0) for n in ("orig", "other", "copy", "link")]
    manifest = write_manifest(tmp_path / "data.jsonl", lines)
    for n in ("copy", "link"):
        shutil.copy(tmp_path / "m/orig.json", tmp_path / f"m/{n}.json")
    items, _ = plan_items(source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT))
    failed = {i.ytid: i.failure for i in items if i.failure}
    assert sorted(failed) == ["copy", "link"]
    assert all(f[0] == "duplicate_audio" and "line 1 (orig.wav)" in f[1] for f in failed.values())
    assert sorted({i.track_id for i in items if i.failure is None}) == ["orig", "other"]


def test_source_root_pins_the_ids_and_a_track_outside_it_is_refused(tmp_path: Path, tiny_codec: Path) -> None:
    tiny_tracks(tmp_path / "lib/rock", ["a.wav"])
    manifest = audiocraft_writer(tmp_path / "lib/rock", tmp_path / "data.jsonl")
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT)
    rooted = replace(cfg, source=replace(cfg.source, root=str(tmp_path / "lib")))
    assert {i.ytid for i in plan_items(rooted)[0]} == {"rock_a_0", "rock_a_1"}
    assert {i.ytid for i in plan_items(cfg)[0]} == {"a_0", "a_1"}  # the common folder: lib/rock
    outside = replace(cfg, source=replace(cfg.source, root=str(tmp_path / "elsewhere")))
    with pytest.raises(PipelineError, match=r"data.jsonl:1: path .* is not inside source.root="):
        run_pipeline(outside, progress=False)


# --- item 4 (audiocraft) and item 5: one bad track is that track's failure; what audiocraft reads ---


def test_each_bad_track_is_its_own_failure_and_the_run_goes_on(tmp_path: Path, tiny_codec: Path) -> None:
    m = tmp_path / "m"
    tiny_tracks(m, ["good.wav", "surrogate.wav", "inf.wav", "deep.wav", "huge.wav", "line\u2028sep.wav"])
    os.rename(os.fsencode(m / "good.wav"), os.fsencode(m) + b"/caf\xe9.wav")  # a Latin-1 name
    write_track(m / "good.wav", 1.0, sr=16000, channels=1, seed=9)
    (m / "surrogate.json").write_text('{"description": "a \\ud83c song"}')  # half an escaped pair
    (m / "inf.json").write_text('{"description": "x", "bpm": 1e400}')
    (m / "deep.json").write_text('{"description": "x", "genre": ' + "[" * 5000 + "]" * 5000 + "}")
    (m / "huge.json").write_text(json.dumps({"description": "x" * 1_000_000}))
    manifest = audiocraft_writer(m, tmp_path / "egs/data.jsonl")
    text = manifest.read_text(encoding="utf-8")
    assert "\\udce9" in text  # as audiocraft's writer escapes the Latin-1 byte
    good = next(line for line in text.splitlines() if "good.wav" in line)
    manifest.write_text(text.replace("\\u2028", "\u2028") + good + "\n")  # a raw U+2028; good.wav named twice
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT,
                        max_failure_fraction=1.0)  # fmt: skip
    assert run_pipeline(cfg, progress=False).exit_code == 0
    reasons = {k: (f["reason"], f["detail"]) for k, f in failures(tmp_path / "set").items()}
    by_reason = sorted((r, k.split("-")[0]) for k, (r, _) in reasons.items())
    assert by_reason == [("bad_metadata", "deep"), ("bad_metadata", "huge"), ("bad_metadata", "inf"),
                         ("bad_metadata", "surrogate"), ("bad_path", "caf_udce9"), ("duplicate_audio", "good")]  # fmt: skip
    details = dict(reasons.values())
    assert "\\udce9" in details["bad_path"] and "UTF-8" in details["bad_path"]
    assert "line 3 (good.wav)" in details["duplicate_audio"]
    got = samples(tmp_path / "set")
    assert {s["source_file"] for s in got.values()} == {"good.wav", "line\u2028sep.wav"}
    assert verify(tmp_path / "set")[0] == []


@pytest.mark.parametrize(
    "sidecar, detail",
    [
        ('{"description": "a", "bpm": 1e400}', r"has the number 1e400, too large for a float"),
        ('{"description": "a", "genre": ' + "[" * 5000 + "]" * 5000 + "}", r"nested too deeply"),
        ('{"description": "a \\udce9"}', r"lone surrogate \\udce9 "),
        (json.dumps({"description": "x" * 5000}), r"the caption has 5000 characters, more than 4096"),
    ],
)
def test_metadata_a_shard_cannot_hold_is_a_bad_metadata_failure_naming_why(
    tmp_path: Path, tiny_codec: Path, sidecar: str, detail: str
) -> None:
    tiny_tracks(tmp_path, ["a.wav"])
    (tmp_path / "a.json").write_text(sidecar)
    manifest = write_manifest(tmp_path / "data.jsonl", [audiocraft_line(str(tmp_path / "a.wav"), 1.0)])
    (item,) = plan_items(source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT))[0]
    assert item.failure is not None and item.failure[0] == "bad_metadata"
    assert re.search(detail, item.failure[1]), item.failure[1]


# --- item 6: dropped short tracks and tails ---


def test_dropped_short_tracks_and_tails_are_counted_apart_and_named(tmp_path: Path, tiny_codec: Path) -> None:
    for name, seconds in (("short.wav", 0.3), ("tail.wav", 1.3), ("full.wav", 1.0)):
        write_track(tmp_path / "m" / name, seconds, sr=16000, channels=1)
        (tmp_path / "m" / name).with_suffix(".json").write_text(json.dumps({"description": name}))
    manifest = audiocraft_writer(tmp_path / "m", tmp_path / "data.jsonl")
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT,
                        split=SplitConfig(eval_fraction=0.0), max_failure_fraction=0.0)  # fmt: skip
    result = run_pipeline(cfg, progress=False)
    assert result.exit_code == 0, result.message  # drops are not failures of the run
    f = failures(tmp_path / "set")
    assert {k: v["reason"] for k, v in f.items()} == {"short": "short_track", "tail_2": "short_tail"}
    assert "0.300 s" in f["short"]["detail"] and "[1.000, 1.300] s of tail.wav" in f["tail_2"]["detail"]
    m = json.loads((tmp_path / "set/manifest.json").read_text())
    seg = m["segmentation"]
    assert (seg["n_dropped_short_tracks"], seg["n_dropped_tails"], seg["n_dropped_short"]) == (1, 1, 2)
    assert m["totals"]["failed"] == 2 and "1 whole tracks (short_track), 1 last segments" in result.message
    assert verify(tmp_path / "set")[0] == []


def test_source_root_is_refused_for_other_sources(tmp_path: Path, tiny_codec: Path) -> None:
    cfg = split_names_cfg("audiofolder", tmp_path, tiny_codec)
    cfg = replace(cfg, source=replace(cfg.source, root="/x"))
    with pytest.raises(PipelineError, match="source.root='/x' is for source=audiocraft only"):
        run_pipeline(cfg, progress=False)


def test_split_hash_is_on_the_lossless_id() -> None:
    assert sanitised("ая.wav") != sanitised("яа.wav")  # used to be 'track' for both
    assert SourceConfig().root is None


# --- review 24 ---


def test_split_names_differing_only_in_case_are_refused(tmp_path: Path, tiny_codec: Path) -> None:
    cfg = split_names_cfg("audiocraft", tmp_path, tiny_codec, train_name="Eval", eval_name="eval")
    with pytest.raises(PipelineError, match=r"differ only in letter case"):
        run_pipeline(cfg, progress=False)


def test_a_duplicate_key_never_equals_a_real_track_id(tmp_path: Path, tiny_codec: Path) -> None:
    tiny_tracks(tmp_path / "m", ["a.wav", "a-dup3.wav"])
    lines = [audiocraft_line(str(tmp_path / "m" / n), 1.0, 16000) for n in ("a.wav", "a-dup3.wav", "a.wav")]
    manifest = write_manifest(tmp_path / "m.jsonl", lines)
    items, _ = plan_items(source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT))
    keys = [i.ytid for i in items]
    assert len(keys) == len(set(keys))
    (dup,) = [i for i in items if i.failure]
    assert dup.csv_row == 3 and dup.failure[0] == "duplicate_audio" and dup.ytid.startswith("a-dup3-")
    encoded = {i.track_id for i in items if not i.failure}
    assert "a" in encoded and len(encoded) == 2 and dup.ytid not in encoded  # the real a-dup3.wav: an id of its own
    result = run_pipeline(source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT),
                          progress=False)  # fmt: skip
    assert result.exit_code == 0, result.message


def test_the_copy_kept_is_the_first_one_encoded(tmp_path: Path, tiny_codec: Path) -> None:
    make_audiofolder(tmp_path, {"": [{"file_name": "a.wav", "caption": ""}]}, seconds=1.0)
    shutil.copy(tmp_path / "a.wav", tmp_path / "b.wav")
    (tmp_path / "metadata.csv").write_text("file_name,caption\na.wav,\nb.wav,a good caption\n")
    items, _ = plan_items(source_config("audiofolder", tmp_path, tmp_path / "set", tiny_codec, segment=SHORT))
    assert [(i.ytid, i.failure and i.failure[0]) for i in items] == [("a", "no_caption"), ("b_0", None), ("b_1", None)]


def test_a_duplicate_names_the_copy_that_is_encoded(tmp_path: Path, tiny_codec: Path) -> None:
    tiny_tracks(tmp_path / "m", ["a.wav"])
    shutil.copy(tmp_path / "m/a.wav", tmp_path / "m/b.wav")
    shutil.copy(tmp_path / "m/a.wav", tmp_path / "m/c.wav")
    (tmp_path / "m/a.json").write_text('{"description": "x", "bpm": NaN}')  # a: bad_metadata
    for n in ("b", "c"):
        (tmp_path / "m" / f"{n}.json").write_text('{"description": "y"}')
    manifest = audiocraft_writer(tmp_path / "m", tmp_path / "m.jsonl")
    items, _ = plan_items(source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT))
    f = {i.ytid: i.failure for i in items if i.failure}
    assert f["a"][0] == "bad_metadata" and f["c"][0] == "duplicate_audio"
    assert "line 2 (b.wav), which is encoded" in f["c"][1]
    assert "b_0" in {i.ytid for i in items}


def test_a_missing_line_does_not_move_the_common_root(tmp_path: Path, tiny_codec: Path) -> None:
    tiny_tracks(tmp_path / "data/music", [f"song{i}.wav" for i in range(4)])
    good = [audiocraft_line(str(tmp_path / "data/music" / f"song{i}.wav"), 1.0, 16000) for i in range(4)]
    plans = {}
    for label, extra in (("clean", []), ("broken", [audiocraft_line("/song9.wav", 1.0, 16000),
                                                    audiocraft_line("/", 1.0, 16000)])):  # fmt: skip
        manifest = write_manifest(tmp_path / f"{label}.jsonl", good + extra)
        cfg = source_config("audiocraft", manifest, tmp_path / label, tiny_codec, segment=SHORT,
                            split=SplitConfig(eval_fraction=0.5))  # fmt: skip
        items, info = plan_items(cfg)
        assert info.root == str(tmp_path / "data/music")
        plans[label] = {(i.track_id, i.split) for i in items if i.failure is None}
    assert plans["clean"] == plans["broken"]


def test_the_id_root_is_recorded_and_kept_while_it_holds_a_track(tmp_path: Path, tiny_codec: Path) -> None:
    tiny_tracks(tmp_path / "data/music/x", ["a.wav"])
    tiny_tracks(tmp_path / "data/music/y", ["b.wav"])
    manifest = audiocraft_writer(tmp_path / "data/music", tmp_path / "m.jsonl")
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT)
    assert run_pipeline(cfg, progress=False).exit_code == 0
    m = json.loads((tmp_path / "set/manifest.json").read_text())
    assert m["source"]["root"] == str(tmp_path / "data/music")
    (tmp_path / "data/music/y/b.wav").unlink()  # the found root would move to data/music/x
    audiocraft_writer(tmp_path / "data/music", manifest)
    assert run_pipeline(cfg, progress=False).exit_code == 0  # it used to be refused, naming source.root
    assert sorted(samples(tmp_path / "set")) == ["x_a_0", "x_a_1"]  # the recorded root, kept: no key renamed
    assert json.loads((tmp_path / "set/manifest.json").read_text())["source"]["root"] == str(tmp_path / "data/music")
    assert run_pipeline(replace(cfg, out_dir=str(tmp_path / "new")), progress=False).exit_code == 0
    assert sorted(samples(tmp_path / "new")) == ["a_0", "a_1"]  # a new set: the common folder


@pytest.mark.parametrize("raw", ["/tmp/x\0.wav", "/", "/tmp/.."])
def test_a_path_no_file_can_have_is_bad_path(tmp_path: Path, tiny_codec: Path, raw: str) -> None:
    tiny_tracks(tmp_path / "m", ["a.wav"])
    lines = [audiocraft_line(str(tmp_path / "m/a.wav"), 1.0, 16000), audiocraft_line(raw, 1.0, 16000)]
    manifest = write_manifest(tmp_path / "m.jsonl", lines)
    items, _ = plan_items(source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT))
    (bad,) = [i for i in items if i.failure]
    assert bad.failure[0] == "bad_path" and "m.jsonl:2" in bad.failure[1] and "\n" not in bad.failure[1]


def test_duplicates_partial_hash_tells_middles_apart(tmp_path: Path) -> None:
    from tokenizer_pipeline.sources.duplicates import duplicates
    from tokenizer_pipeline.sources.track import Track

    size = 300 * 1024
    base = bytes(range(256)) * (size // 256)
    other = bytearray(base)
    other[size // 2] ^= 1  # differs only in the middle: same size, same first and last 64 KiB
    for name, data in (("a", base), ("b", bytes(other)), ("c", base)):
        (tmp_path / name).write_bytes(data)
    tracks = [Track(line=i, source_path=n, audio_path=tmp_path / n, source_file=n) for i, n in enumerate("abc", 1)]
    assert duplicates(tracks) == {2: 0}
    assert duplicates(tracks, [1, 2]) == {}  # c is not b; a is no candidate


def test_a_dotdot_after_a_symlink_reads_the_file_the_os_opens(tmp_path: Path, tiny_codec: Path) -> None:
    tiny_tracks(tmp_path / "real", ["x.wav"])
    write_track(tmp_path / "ds/x.wav", 2.0, sr=16000, channels=1, seed=9)
    (tmp_path / "ds/x.json").write_text(json.dumps({"description": "the other file"}))
    (tmp_path / "real/deep").mkdir()
    os.symlink(tmp_path / "real/deep", tmp_path / "ds/link")
    raw = str(tmp_path / "ds/link/../x.wav")
    manifest = write_manifest(tmp_path / "m.jsonl", [audiocraft_line(raw, 1.0, 16000)])
    items, _ = plan_items(source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT))
    assert {i.audio_path for i in items} == {raw} and {i.caption for i in items} == {"song x.wav"}
    assert len(items) == 2  # the 1 s file the OS opens, not the 2 s one the text names


def test_ids_do_not_depend_on_unicode_normalisation() -> None:
    from tokenizer_pipeline.sources.track_ids import track_ids

    nfc, nfd = "caf\u00e9.wav", "cafe\u0301.wav"
    assert track_ids([nfc]) == track_ids([nfd]) and sanitised(nfc) == sanitised(nfd)
    assert len(set(track_ids([nfc, nfd]))) == 2  # both listed: two files, two ids


def test_a_sidecar_field_audiocraft_never_reads_cannot_fail_the_track(tmp_path: Path, tiny_codec: Path) -> None:
    tiny_tracks(tmp_path, ["a.wav"])
    (tmp_path / "a.json").write_text('{"description": "a", "private_score": 1e400, "other": NaN}')
    manifest = write_manifest(tmp_path / "data.jsonl", [audiocraft_line(str(tmp_path / "a.wav"), 1.0)])
    items, _ = plan_items(source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT))
    assert [i.failure for i in items] == [None, None] and json.loads(items[0].metadata_json) == {"description": "a"}

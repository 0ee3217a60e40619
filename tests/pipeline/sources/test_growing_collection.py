"""Your own audio that grows (tracks added, renamed, moved or removed between runs): a track's split is a function of
its audio, never of where it sits or what sits beside it; keys stay put where they can; a grown collection encoded
into the same out_dir redoes only the shards of its new tracks, and no resume or heal moves a kept track between
splits."""

from __future__ import annotations

import json
import os
import shutil
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pytest

import tokenizer_pipeline.run.pipeline as run
from tests.pipeline.sources.helpers import audiocraft_writer, samples, source_config, write_track
from tokenizer_pipeline.config import SegmentConfig, SplitConfig
from tokenizer_pipeline.run.kept import KeptSet, kept_shards
from tokenizer_pipeline.run.pipeline import run_pipeline
from tokenizer_pipeline.shards.verify import verify
from tokenizer_pipeline.shards.write_shards import sha256_file
from tokenizer_pipeline.sources.plan import plan_items
from tokenizer_pipeline.sources.splits import audio_is_eval, unit

SHORT = SegmentConfig(seconds=0.5)  # one segment per 0.5-s track
HALF = SplitConfig(eval_fraction=0.5)
NAMES = [f"rock/r{i}.wav" for i in range(4)] + [f"jazz/j{i}.wav" for i in range(4)]


def add_tracks(folder: Path, names: list[str], salt: int = 0) -> None:
    """0.5-s tracks whose audio depends only on their name (and `salt`), each with a sidecar caption."""
    for name in names:
        write_track(folder / name, 0.5, sr=16000, channels=1, seed=zlib.crc32(name.encode()) + salt)
        (folder / name).with_suffix(".json").write_text(json.dumps({"description": f"song {name}"}))


def audiofolder_writer(folder: Path) -> Path:
    """metadata.csv naming every wav under `folder` (as a user's script would write it again after a change)."""
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.wav"))
    (folder / "metadata.csv").write_text("file_name,caption\n" + "".join(f"{n},song {n}\n" for n in names))
    return folder


class Track(NamedTuple):
    key: str  # the track id (the keys' prefix)
    split: str
    source_file: str


def by_audio(out: Path) -> dict[str, Track]:
    """audio sha256 -> the track a set holds samples of."""
    return {s["source_sha256"]: Track(s["track_id"], s["split"], s["source_file"]) for s in samples(out).values()}


def rename(old: Path, new: Path) -> None:
    new.parent.mkdir(parents=True, exist_ok=True)
    os.rename(old, new)
    if old.with_suffix(".json").exists():
        os.rename(old.with_suffix(".json"), new.with_suffix(".json"))


def remove(path: Path) -> None:
    path.unlink()
    path.with_suffix(".json").unlink(missing_ok=True)


# What happens to the collection, in `top` (the collection is `top/old`), and the keys it may change: its own tracks'.
CHANGES: dict[str, tuple[Callable[[Path], None], set[str]]] = {
    "a track in a sibling folder": (lambda top: add_tracks(top / "new", ["x.wav"]), set()),
    "the collection's folder renamed": (lambda top: os.rename(top / "old", top / "older"), set()),
    "a sub-folder renamed": (lambda top: os.rename(top / "old/jazz", top / "old/blues"), {f"jazz_j{i}" for i in range(4)}),
    "a track renamed": (lambda top: rename(top / "old/rock/r0.wav", top / "old/rock/z.wav"), {"rock_r0"}),
    "a track removed": (lambda top: remove(top / "old/rock/r1.wav"), set()),
}  # fmt: skip


def check_kept(before: dict[str, Track], after: dict[str, Track], renamed: set[str]) -> None:
    """Every track in both sets keeps its split, and its key unless it is one of `renamed`."""
    assert {t.split for t in before.values()} == {"train", "eval"}  # both splits drawn: the check means something
    kept = before.keys() & after.keys()
    assert len(kept) >= len(before) - 1  # only a removed track is gone
    assert {sha: after[sha].split for sha in kept} == {sha: before[sha].split for sha in kept}
    assert {before[sha].key for sha in kept if after[sha].key != before[sha].key} == renamed
    assert all((t.split == "eval") == audio_is_eval(sha, 0.5) for sha, t in after.items())  # the rule, by audio


@pytest.mark.parametrize("change", list(CHANGES))
def test_audiocraft_a_change_elsewhere_moves_no_track_and_renames_no_other_key(
    tmp_path: Path, tiny_codec: Path, change: str
) -> None:
    """Absolute paths, as audiocraft's writer makes them; the manifest is written again after the change and encoded
    into the same out_dir (keys kept) and into a new one (splits kept: no kept track moves to the other split)."""
    top, manifest = tmp_path / "music", tmp_path / "egs/data.jsonl"
    add_tracks(top / "old", NAMES)
    audiocraft_writer(top, manifest)
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT, split=HALF)
    assert run_pipeline(cfg, progress=False).exit_code == 0
    before = by_audio(tmp_path / "set")
    apply, renamed = CHANGES[change]
    apply(top)
    audiocraft_writer(top, manifest)
    assert run_pipeline(cfg, progress=False).exit_code == 0
    after = by_audio(tmp_path / "set")
    check_kept(before, after, renamed)
    assert verify(tmp_path / "set")[0] == []
    m = json.loads((tmp_path / "set/manifest.json").read_text())
    assert m["format_version"] == 5 and m["source"]["split_rule"] == "audio_sha256"
    if change == "a track in a sibling folder":
        assert m["source"]["root"] == str(top / "old")  # the root the set recorded is kept
        assert {t.key for sha, t in after.items() if sha not in before} == {"up_new_x"}
    fresh = tmp_path / "fresh"
    assert run_pipeline(source_config("audiocraft", manifest, fresh, tiny_codec, segment=SHORT, split=HALF),
                        progress=False).exit_code == 0  # fmt: skip
    assert {sha: t.split for sha, t in by_audio(fresh).items()} == {sha: t.split for sha, t in after.items()}


AUDIOFOLDER_CHANGES: dict[str, tuple[Callable[[Path], None], set[str]]] = {
    "a track in a sibling folder": (lambda d: add_tracks(d / "new", ["x.wav"]), set()),
    "a sub-folder renamed": (lambda d: os.rename(d / "jazz", d / "blues"), {f"jazz_j{i}" for i in range(4)}),
    "a track renamed": (lambda d: rename(d / "rock/r0.wav", d / "rock/z.wav"), {"rock_r0"}),
    "a track removed": (lambda d: remove(d / "rock/r1.wav"), set()),
}


@pytest.mark.parametrize("change", list(AUDIOFOLDER_CHANGES))
def test_audiofolder_without_split_folders_a_change_elsewhere_moves_no_track(
    tmp_path: Path, tiny_codec: Path, change: str
) -> None:
    folder = tmp_path / "mine"
    add_tracks(folder, NAMES)
    audiofolder_writer(folder)
    cfg = source_config("audiofolder", folder, tmp_path / "set", tiny_codec, segment=SHORT, split=HALF)
    assert run_pipeline(cfg, progress=False).exit_code == 0
    before = by_audio(tmp_path / "set")
    apply, renamed = AUDIOFOLDER_CHANGES[change]
    apply(folder)
    audiofolder_writer(folder)
    assert run_pipeline(cfg, progress=False).exit_code == 0
    check_kept(before, by_audio(tmp_path / "set"), renamed)
    assert json.loads((tmp_path / "set/manifest.json").read_text())["source"]["split_rule"] == "audio_sha256"
    assert verify(tmp_path / "set")[0] == []


def test_audiofolder_renamed_as_a_whole_gives_the_same_keys_and_splits(tmp_path: Path, tiny_codec: Path) -> None:
    """source.dir is part of a set's config, so the renamed folder is encoded into a new set: the same set."""
    add_tracks(tmp_path / "mine", NAMES)
    audiofolder_writer(tmp_path / "mine")
    sets = []
    for name in ("mine", "renamed"):
        if name == "renamed":
            os.rename(tmp_path / "mine", tmp_path / "renamed")
        out = tmp_path / f"set-{name}"
        cfg = source_config("audiofolder", tmp_path / name, out, tiny_codec, segment=SHORT, split=HALF)
        assert run_pipeline(cfg, progress=False).exit_code == 0
        sets.append(by_audio(out))
    check_kept(sets[0], sets[1], set())


# --- item 3: a grown collection into the same out_dir ---


@pytest.mark.parametrize("kind", ["audiocraft", "audiofolder"])
def test_a_grown_collection_redoes_only_the_new_tracks_shards(
    tmp_path: Path, tiny_codec: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new tracks sort first (audiocraft's writer sorts paths), so every planned shard would shift: the set keeps
    its shards and puts the new tracks' samples in new ones. It then holds what a fresh run holds, laid out apart."""
    top = tmp_path / "music"
    add_tracks(top / "old", NAMES)
    where = audiocraft_writer(top, tmp_path / "egs/data.jsonl") if kind == "audiocraft" else audiofolder_writer(top)
    cfg = source_config(kind, where, tmp_path / "set", tiny_codec, segment=SHORT, split=HALF)
    assert run_pipeline(cfg, progress=False).exit_code == 0
    before = by_audio(tmp_path / "set")
    tars = {p: p.read_bytes() for p in (tmp_path / "set").rglob("*.tar")}
    add_tracks(top / "a new", ["x.wav", "y.wav"])
    audiocraft_writer(top, where) if kind == "audiocraft" else audiofolder_writer(top)

    real, redone = run.encode_shard, []
    monkeypatch.setattr(run, "encode_shard", lambda plan, *a, **k: (redone.append(plan), real(plan, *a, **k))[1])
    assert run_pipeline(cfg, progress=False).exit_code == 0
    after = by_audio(tmp_path / "set")
    new = {t.key for sha, t in after.items() if sha not in before}
    assert len(new) == 2 and redone
    assert {row.track_id for plan in redone for row in plan.rows} == new  # only the new tracks' shards
    assert all(p.read_bytes() == data for p, data in tars.items())  # every shard there was, untouched
    check_kept(before, after, set())
    assert verify(tmp_path / "set")[0] == []
    m = json.loads((tmp_path / "set/manifest.json").read_text())
    assert m["totals"]["encoded"] == len(after) and m["totals"]["failed"] == 0
    if kind == "audiofolder":  # the same samples as a fresh run (keys, splits, codes), but for their csv_row
        monkeypatch.setattr(run, "encode_shard", real)
        fresh = source_config(kind, where, tmp_path / "fresh", tiny_codec, segment=SHORT, split=HALF)
        assert run_pipeline(fresh, progress=False).exit_code == 0

        def neutral(out: Path) -> dict:
            return {k: v | {"csv_row": None} for k, v in samples(out).items()}

        assert neutral(tmp_path / "set") == neutral(tmp_path / "fresh")


def test_a_track_re_exported_in_place_keeps_its_split(tmp_path: Path, tiny_codec: Path) -> None:
    """Other bytes at the same path (re-tagged, re-exported): the heal re-encodes it in the split the set gave it,
    though its new audio would draw the other one; a new set draws by the audio."""
    add_tracks(tmp_path / "music", NAMES)
    manifest = audiocraft_writer(tmp_path / "music", tmp_path / "data.jsonl")
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT, split=HALF)
    assert run_pipeline(cfg, progress=False).exit_code == 0
    was = {t.source_file: t.split for t in by_audio(tmp_path / "set").values()}["rock/r2.wav"]
    salt = 1
    while True:  # new audio whose own draw is the other split
        add_tracks(tmp_path / "music", ["rock/r2.wav"], salt=salt)
        sha = sha256_file(tmp_path / "music/rock/r2.wav")
        if (unit(sha) < 0.5) != (was == "eval"):
            break
        salt += 1
    assert run_pipeline(cfg, progress=False).exit_code == 0
    assert by_audio(tmp_path / "set")[sha] == Track("rock_r2", was, "rock/r2.wav")
    fresh = source_config("audiocraft", manifest, tmp_path / "fresh", tiny_codec, segment=SHORT, split=HALF)
    assert run_pipeline(fresh, progress=False).exit_code == 0
    assert by_audio(tmp_path / "fresh")[sha].split != was


def test_a_collection_converted_to_flac_keeps_every_split(tmp_path: Path, tiny_codec: Path) -> None:
    """WAV -> FLAC keeps every key (a track id has no extension) but changes every file's bytes and name: encoded into
    the same set again, each key keeps the split the set gave it (review: 4 of 8 moved, a model then scored on its
    own training tracks)."""
    import soundfile as sf

    add_tracks(tmp_path / "music", NAMES)
    manifest = audiocraft_writer(tmp_path / "music", tmp_path / "data.jsonl")
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT, split=HALF)
    assert run_pipeline(cfg, progress=False).exit_code == 0
    before = {t.key: t.split for t in by_audio(tmp_path / "set").values()}
    for name in NAMES:
        wav = tmp_path / "music" / name
        audio, sr = sf.read(wav)
        sf.write(wav.with_suffix(".flac"), audio, sr)
        wav.unlink()
    audiocraft_writer(tmp_path / "music", tmp_path / "data.jsonl")
    assert run_pipeline(cfg, progress=False).exit_code == 0
    after = {t.key: (t.split, t.source_file) for t in by_audio(tmp_path / "set").values()}
    assert all(f.endswith(".flac") for _, f in after.values())
    assert {k: split for k, (split, _) in after.items()} == before


def test_another_source_root_is_no_longer_refused(tmp_path: Path, tiny_codec: Path) -> None:
    """source.root set to another folder renames every key: the set is laid out again in place (it used to be
    refused), every split kept."""
    add_tracks(tmp_path / "lib/music", NAMES)
    manifest = audiocraft_writer(tmp_path / "lib/music", tmp_path / "data.jsonl")
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT, split=HALF)
    assert run_pipeline(cfg, progress=False).exit_code == 0
    before = by_audio(tmp_path / "set")
    rooted = replace(cfg, source=replace(cfg.source, root=str(tmp_path / "lib")))
    assert run_pipeline(rooted, progress=False).exit_code == 0
    after = by_audio(tmp_path / "set")
    assert {t.key for t in after.values()} == {f"music_{t.key}" for t in before.values()}
    assert {sha: t.split for sha, t in after.items()} == {sha: t.split for sha, t in before.items()}
    assert verify(tmp_path / "set")[0] == []


def test_the_same_audio_under_two_paths_draws_one_split(tmp_path: Path, tiny_codec: Path) -> None:
    add_tracks(tmp_path / "m", NAMES)
    (tmp_path / "m/copies").mkdir()
    for name in NAMES:  # a copy of every track in another folder: the copies are duplicate_audio failures
        copy = tmp_path / "m/copies" / name.replace("/", "-")
        shutil.copy(tmp_path / "m" / name, copy)
        shutil.copy((tmp_path / "m" / name).with_suffix(".json"), copy.with_suffix(".json"))
    manifest = audiocraft_writer(tmp_path / "m", tmp_path / "data.jsonl")
    items, _ = plan_items(source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SHORT,
                                        split=HALF))  # fmt: skip
    split_of_file = {i.source_file: i.split for i in items}
    copies = [i for i in items if i.failure is not None]
    assert len(copies) == len(NAMES) and all(i.failure[0] == "duplicate_audio" for i in copies)
    for name in NAMES:
        assert split_of_file[f"copies/{name.replace('/', '-')}"] == split_of_file[name]
    assert set(split_of_file.values()) == {"train", "eval"}


# --- the layout of a set encoded again (kept.py) ---


class Row(NamedTuple):
    ytid: str
    split: str


def test_kept_shards_keep_their_samples_and_new_ones_go_to_new_shards() -> None:
    """New samples among the old ones would shift every shard of a fresh layout: the set keeps its shards (a shard
    that lost a sample is redone, one left empty is gone) and the new samples fill new ones."""
    rows = [Row(k, "train") for k in ("n0", "a", "b", "c", "n1", "n2", "d", "e")] + [Row("x", "eval")]
    kept = KeptSet(shards={"train": {0: ["a", "b"], 1: ["c", "gone"], 2: ["d", "e"], 3: ["gone"]}, "eval": {0: ["x"]}})
    plans = kept_shards(rows, ["train", "eval"], 2, kept)
    got = [(p.split, p.index, [r.ytid for r in p.rows]) for p in plans]
    assert got == [("train", 0, ["a", "b"]), ("train", 1, ["c"]), ("train", 2, ["d", "e"]),
                   ("train", 3, ["n0", "n1"]), ("train", 4, ["n2"]), ("eval", 0, ["x"])]  # fmt: skip


def test_kept_shards_are_a_fresh_layout_when_that_redoes_no_more() -> None:
    """A healed or appended track that a fresh layout absorbs as cheaply: the fresh layout (a fresh run's bytes)."""
    rows = [Row(k, "train") for k in ("a0", "a1", "a2", "b0", "b1")]
    healed = KeptSet(shards={"train": {0: ["a", "b0"], 1: ["b1"]}})  # track a failed as a whole, then healed
    fresh = kept_shards(rows, ["train", "eval"], 2, None)
    assert kept_shards(rows, ["train", "eval"], 2, healed) == fresh  # 3 shards redone either way
    appended = KeptSet(shards={"train": {0: ["a0", "a1"], 1: ["a2", "b0"]}})  # b1 added at the end
    assert kept_shards(rows, ["train", "eval"], 2, appended) == fresh
    assert kept_shards(rows, ["train", "eval"], 3, KeptSet()) == kept_shards(rows, ["train", "eval"], 3, None)

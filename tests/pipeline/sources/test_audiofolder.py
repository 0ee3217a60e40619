"""source=audiofolder: a Hugging Face audiofolder (metadata.csv / metadata.jsonl, optional split folders) -> shards,
and the rows and captions we read checked against `datasets.load_dataset("audiofolder", data_dir=...)` itself."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from tests.pipeline.sources.helpers import failures, make_audiofolder, samples, snapshot, source_config
from tokenizer_pipeline.config import SegmentConfig, ShardConfig, SourceConfig, SplitConfig
from tokenizer_pipeline.errors import PipelineError
from tokenizer_pipeline.run.pipeline import run_pipeline
from tokenizer_pipeline.shards.verify import verify
from tokenizer_pipeline.shards.write_shards import sha256_file
from tokenizer_pipeline.sources.audiofolder import read_audiofolder
from tokenizer_pipeline.sources.captions import caption_of


def _rows() -> list[dict]:
    return [
        {"file_name": "a.wav", "caption": "warm piano", "aspect_list": "piano, calm", "_seconds": 5.0},
        {"file_name": "songs/b b.wav", "caption": "fast drums", "aspect_list": "['drums', 'fast']"},
        {"file_name": "c.wav", "caption": "", "aspect_list": ""},  # no caption
    ]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_metadata_file_to_shards(tmp_path: Path, tiny_codec: Path, fmt: str) -> None:
    root = make_audiofolder(tmp_path / "folder", {"": _rows()}, fmt=fmt)
    cfg = source_config("audiofolder", root, tmp_path / "set", tiny_codec, segment=SegmentConfig(seconds=2.0),
                        split=SplitConfig(eval_fraction=0.0))  # fmt: skip
    assert run_pipeline(cfg, progress=False).exit_code == 0
    got = samples(tmp_path / "set")
    # a: 5 s -> 2 x 2 s + a 1-s tail < 1.6 s dropped; songs/b b: 3 s -> 1 + a 1-s tail dropped
    assert sorted(got) == ["a_0", "a_1", "songs_b_b_0"]
    assert got["a_1"]["caption"] == "warm piano" and got["a_1"]["aspect_list"] == ["piano", "calm"]
    assert (
        got["songs_b_b_0"]["aspect_list"] == ["drums", "fast"]
        and got["songs_b_b_0"]["csv_row"] == {"csv": 3, "jsonl": 2}[fmt]
    )  # its line
    assert got["songs_b_b_0"]["source_path"] == "songs/b b.wav" and got["a_0"]["source_kind"] == "audiofolder"
    assert {k: f["reason"] for k, f in failures(tmp_path / "set").items()} == {
        "c": "no_caption", "a_2": "short_tail", "songs_b_b_1": "short_tail"
    }  # fmt: skip
    m = json.loads((tmp_path / "set/manifest.json").read_text())
    assert m["source"]["sha256"] == sha256_file(root / f"metadata.{fmt}")
    assert m["source"]["metadata_files"] == [f"metadata.{fmt}"] and m["segmentation"]["n_dropped_short"] == 2
    assert verify(tmp_path / "set")[0] == []


def test_caption_falls_back_to_the_text_column(tmp_path: Path, tiny_codec: Path) -> None:
    root = make_audiofolder(tmp_path / "folder", {"": [{"file_name": "a.wav", "text": "a text caption"}]})
    cfg = source_config("audiofolder", root, tmp_path / "set", tiny_codec, split=SplitConfig(eval_fraction=0.0),
                        segment=SegmentConfig(seconds=3.0))  # fmt: skip
    assert run_pipeline(cfg, progress=False).exit_code == 0
    assert samples(tmp_path / "set")["a_0"]["caption"] == "a text caption"


def test_split_folders_map_to_train_and_eval(tmp_path: Path, tiny_codec: Path) -> None:
    rows = {
        "train": [{"file_name": "a.wav", "caption": "one"}, {"file_name": "b.wav", "caption": "two"}],
        "validation": [{"file_name": "c.wav", "caption": "three"}],
        "test": [{"file_name": "d.wav", "caption": "four"}],
    }
    root = make_audiofolder(tmp_path / "folder", rows, fmt="jsonl")
    cfg = source_config("audiofolder", root, tmp_path / "set", tiny_codec, segment=SegmentConfig(seconds=3.0),
                        split=SplitConfig(eval_fraction=1.0))  # the folders decide, not the hash  # fmt: skip
    assert run_pipeline(cfg, progress=False).exit_code == 0
    got = {k: v["split"] for k, v in samples(tmp_path / "set").items()}
    assert got == {"train_a_0": "train", "train_b_0": "train", "validation_c_0": "eval", "test_d_0": "eval"}
    m = json.loads((tmp_path / "set/manifest.json").read_text())
    assert m["source"]["metadata_files"] == ["test/metadata.jsonl", "train/metadata.jsonl", "validation/metadata.jsonl"]
    assert m["source"]["split_rule"] == "folders"


@pytest.mark.parametrize("name", ["../outside.wav", "sub/../../outside.wav", "/tmp/outside.wav"])
def test_a_file_name_leaving_the_folder_is_refused(tmp_path: Path, tiny_codec: Path, name: str) -> None:
    root = make_audiofolder(tmp_path / "folder", {"": [{"file_name": "a.wav", "caption": "ok"}]})
    (root / "metadata.csv").write_text(f"file_name,caption\na.wav,ok\n{name},escape\n")
    with pytest.raises(PipelineError, match=r"metadata.csv:3: file_name '.*' (contains '\.\.'|is absolute)"):
        run_pipeline(source_config("audiofolder", root, tmp_path / "set", tiny_codec), progress=False)
    assert not (tmp_path / "set").exists()


def test_a_symlinked_folder_leading_outside_is_refused(tmp_path: Path, tiny_codec: Path) -> None:
    root = make_audiofolder(tmp_path / "folder", {"": [{"file_name": "a.wav", "caption": "ok"}]})
    (tmp_path / "elsewhere").mkdir()
    (root / "link").symlink_to(tmp_path / "elsewhere")
    (root / "metadata.csv").write_text("file_name,caption\na.wav,ok\nlink/x.wav,escape\n")
    with pytest.raises(PipelineError, match="metadata.csv:3: file_name 'link/x.wav' leads outside"):
        run_pipeline(source_config("audiofolder", root, tmp_path / "set", tiny_codec), progress=False)


# ---- the reference: datasets' own audiofolder reader (a test-only dependency; audio is never decoded by it)


def _ours(root: Path, column: str = "caption") -> dict[tuple[str, str], str | None]:
    """(split as datasets names it, resolved audio path) -> our caption, for every metadata row we read."""
    tracks, _ = read_audiofolder(root)
    fallback = "text" if column == "caption" else None
    out = {}
    for t in tracks:
        split = t.audio_path.relative_to(root).parts[0] if t.split else "train"
        out[(split, str(t.audio_path.resolve()))] = caption_of(t.metadata, "field", column, "", fallback)
    return out


def _theirs(root: Path, cache: Path, column: str = "caption") -> dict[tuple[str, str], str | None]:
    import datasets  # test-only: make setup installs it (pinned in constraints.txt)

    loaded = datasets.load_dataset("audiofolder", data_dir=str(root), cache_dir=str(cache))
    out = {}
    for split, ds in loaded.items():
        for row in ds.cast_column("audio", datasets.Audio(decode=False)):
            text = row.get(column)
            out[(split, str(Path(row["audio"]["path"]).resolve()))] = text.strip() if text and text.strip() else None
    return out


LAYOUTS = {
    "csv at the root": ({"": _rows()}, "csv"),
    "jsonl at the root": ({"": _rows()}, "jsonl"),
    "csv per split folder": ({"train": _rows()[1:2], "test": _rows()[0::2]}, "csv"),
    "jsonl per split folder": ({"train": _rows()[:1], "validation": _rows()[1:]}, "jsonl"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_rows_and_captions_equal_what_datasets_reads(tmp_path: Path, layout: str) -> None:
    rows, fmt = LAYOUTS[layout]
    root = make_audiofolder(tmp_path / "folder", rows, fmt=fmt, seconds=0.2)
    ours, theirs = _ours(root), _theirs(root, tmp_path / "hf_cache")
    assert len(ours) == 3 and ours == theirs


def test_the_jsonl_metadata_we_record_is_datasets_row(tmp_path: Path) -> None:
    """Every other column reaches the sample's `metadata` verbatim, as datasets gives it."""
    import datasets

    rows = [{"file_name": "a.wav", "caption": "x", "bpm": 120, "tags": ["a", "b"]},
            {"file_name": "b.wav", "caption": "y", "bpm": 90, "tags": []}]  # fmt: skip
    root = make_audiofolder(tmp_path / "folder", {"": [dict(r) for r in rows]}, fmt="jsonl", seconds=0.2)
    tracks, _ = read_audiofolder(root)
    ds = datasets.load_dataset("audiofolder", data_dir=str(root), cache_dir=str(tmp_path / "hf_cache"))["train"]
    theirs = {Path(r["audio"]["path"]).name: {k: v for k, v in r.items() if k != "audio"}
              for r in ds.cast_column("audio", datasets.Audio(decode=False))}  # fmt: skip
    assert {t.audio_path.name: {k: v for k, v in t.metadata.items() if k != "file_name"} for t in tracks} == theirs


def test_template_captions_from_audiofolder_columns(tmp_path: Path, tiny_codec: Path) -> None:
    root = make_audiofolder(tmp_path / "folder", {"": [{"file_name": "a.wav", "description": "lofi beat",
                                                         "genre": "Hip Hop", "bpm": "85"}]})  # fmt: skip
    src = SourceConfig(kind="audiofolder", dir=str(root), caption="template", caption_column="caption")
    cfg = source_config("audiofolder", root, tmp_path / "set", tiny_codec, source=src, split=SplitConfig(eval_fraction=0),
                        segment=SegmentConfig(seconds=3.0))  # fmt: skip
    assert run_pipeline(cfg, progress=False).exit_code == 0
    assert samples(tmp_path / "set")["a_0"]["caption"] == "lofi beat genre: hip hop. bpm: 85"


def test_a_jsonl_row_with_nan_is_its_tracks_failure_naming_it(tmp_path: Path, tiny_codec: Path) -> None:
    """NaN is not JSON: the row's track is a bad_metadata failure naming the line and the fix; the others are encoded
    (it used to stop the whole run)."""
    make_audiofolder(tmp_path / "mine", {"": [{"file_name": "a.wav", "caption": "x"}, {"file_name": "b.wav"}]})
    (tmp_path / "mine/metadata.jsonl").write_text(
        '{"file_name": "a.wav", "caption": "x", "bpm": NaN}\n{"file_name": "b.wav", "caption": "y"}\n'
    )
    (tmp_path / "mine/metadata.csv").unlink()
    cfg = source_config("audiofolder", tmp_path / "mine", tmp_path / "set", tiny_codec, segment=SegmentConfig(seconds=3),
                        split=SplitConfig(eval_fraction=0.0), max_failure_fraction=1.0)  # fmt: skip
    assert run_pipeline(cfg, progress=False).exit_code == 0
    assert list(samples(tmp_path / "set")) == ["b_0"]
    bad = failures(tmp_path / "set")["a"]
    assert bad["reason"] == "bad_metadata" and re.search(r"metadata.jsonl:1: .*NaN.*null", bad["detail"])


def test_a_changed_metadata_row_redoes_only_its_tracks_shard(tmp_path: Path, tiny_codec: Path) -> None:
    """The metadata file is not the set's identity (a collection grows, so it changes): a re-captioned row redoes only
    the shard of that track's segments, the other shards stay, and the set equals a fresh run's."""
    make_audiofolder(
        tmp_path / "mine", {"": [{"file_name": "a.wav", "caption": "x"}, {"file_name": "b.wav", "caption": "y"}]}
    )
    cfg = source_config("audiofolder", tmp_path / "mine", tmp_path / "set", tiny_codec, segment=SegmentConfig(seconds=3),
                        shard=ShardConfig(max_samples=1))  # fmt: skip
    assert run_pipeline(cfg, progress=False).exit_code == 0
    before = {p: p.read_bytes() for p in (tmp_path / "set").rglob("*.tar")}
    (tmp_path / "mine/metadata.csv").write_text("file_name,caption\na.wav,a new caption\nb.wav,y\n", encoding="utf-8")
    assert run_pipeline(cfg, progress=False).exit_code == 0
    after = {p: p.read_bytes() for p in (tmp_path / "set").rglob("*.tar")}
    changed = [p for p in before if after[p] != before[p]]
    assert len(changed) == 1 and b"a_0.json" in after[changed[0]] and len(before) == 2
    assert samples(tmp_path / "set")["a_0"]["caption"] == "a new caption"
    assert run_pipeline(replace(cfg, out_dir=str(tmp_path / "fresh")), progress=False).exit_code == 0
    got, fresh = snapshot(tmp_path / "set"), snapshot(tmp_path / "fresh")
    assert {k: v for k, v in got.items() if k != "manifest.json"} == {
        k: v for k, v in fresh.items() if k != "manifest.json"
    }


def test_a_caption_column_no_row_has_is_refused_naming_the_columns(tmp_path: Path, tiny_codec: Path) -> None:
    """metadata.csv with 'file_name,desc': every track used to become a no_caption failure reading "field 'caption' is
    empty" after the codec loaded and out_dir was written; the column does not exist, so it is a setting to fix."""
    make_audiofolder(
        tmp_path / "mine", {"": [{"file_name": "a.wav", "desc": "x"}, {"file_name": "b.wav", "desc": "y"}]}
    )
    with pytest.raises(
        PipelineError, match=r"source.caption_column='caption'.*\['desc', 'file_name'\].*caption_column="
    ):
        run_pipeline(source_config("audiofolder", tmp_path / "mine", tmp_path / "set", tiny_codec), progress=False)
    assert not (tmp_path / "set").exists()

"""source=audiofolder on messy folders: the metadata files, rows, captions and splits we read equal
`datasets.load_dataset("audiofolder", data_dir=...)` on a grid of layouts; what datasets would leave unread is refused
with every such file listed; one bad row is that track's failure, never the run's end."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from tests.pipeline.sources.helpers import failures, samples, source_config, write_track
from tokenizer_pipeline.config import SegmentConfig, SplitConfig
from tokenizer_pipeline.run.pipeline import run_pipeline
from tokenizer_pipeline.sources.audiofolder import read_audiofolder
from tokenizer_pipeline.sources.audiofolder_layout import find_layout
from tokenizer_pipeline.sources.audiofolder_rows import PANDAS_NA
from tokenizer_pipeline.sources.captions import caption_of
from tokenizer_pipeline.sources.track import SourceError


def _write(root: Path, folder: str, rows: list[dict], fmt: str = "csv") -> None:
    """folder/metadata.<fmt> with `rows`; a short wav for each row's *file_name."""
    d = root / folder
    d.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(rows):
        name = next(v for k, v in r.items() if k.endswith("file_name"))
        write_track(d / name.replace("\\", "/"), 0.2, sr=8000, channels=1, seed=i)
    if fmt == "csv":
        cols = list(dict.fromkeys(c for r in rows for c in r))
        with (d / "metadata.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
    elif fmt == "jsonl":
        (d / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), d / "metadata.parquet")


def _rows(*names: str, column: str = "file_name") -> list[dict]:
    return [{column: n, "caption": f"caption of {n}"} for n in names]


def _ours(root: Path) -> dict[tuple[str, str], str | None]:
    """(datasets' split name, resolved audio path) -> our caption, for every track we read."""
    layout = find_layout(root)
    hf_split = {f.relative_to(root).as_posix(): s or "train" for f, s in layout.splits.items()}
    tracks, _ = read_audiofolder(root)
    assert all(t.metadata_error is None for t in tracks)
    return {
        (hf_split[str(t.metadata_file)], str(t.audio_path.resolve())): caption_of(
            t.metadata, "field", "caption", "", "text"
        )
        for t in tracks
    }


def _theirs(root: Path, cache: Path) -> dict[tuple[str, str], str | None]:
    import datasets  # test-only (make setup), the reference

    loaded = datasets.load_dataset("audiofolder", data_dir=str(root), cache_dir=str(cache))
    out = {}
    for split, ds in loaded.items():
        audio = [k for k, f in ds.features.items() if isinstance(f, datasets.Audio)]
        assert len(audio) == 1
        for row in ds.cast_column(audio[0], datasets.Audio(decode=False)):
            text = row.get("caption")
            text = text.strip() if isinstance(text, str) and text.strip() else None
            out[(split, str(Path(row[audio[0]]["path"]).resolve()))] = text
    return out


def _layout_extra(root: Path) -> None:  # metadata in a sub-folder and the root: all 3 tracks read, not the root's 1
    _write(root, "", _rows("a.wav"))
    _write(root, "extra", _rows("b.wav", "c.wav"))


def _layout_holdout(root: Path, fmt: str = "csv") -> None:
    _write(root, "", _rows("a.wav"), fmt)
    _write(root, "holdout", _rows("c.wav", "deeper/d.wav"), fmt)
    _write(root, "holdout/more", _rows("e.wav"), fmt)


def _layout_nested(root: Path, fmt: str = "jsonl") -> None:
    _write(root, "data/train", _rows("a.wav", "b.wav"), fmt)
    _write(root, "data/test", _rows("c.wav"), fmt)
    _write(root, "data/validation/part1", _rows("d.wav"), fmt)


def _layout_keywords(root: Path) -> None:
    _write(root, "train-clean", _rows("a.wav"))
    _write(root, "dev_other", _rows("b.wav"))
    _write(root, "my.test", _rows("c.wav"))
    write_track(root / "trainee/x.wav", 0.2, sr=8000, channels=1)  # no split folder ('train' ends at -._ 0-9 or $)


def _layout_case(root: Path) -> None:  # datasets' globs are case-sensitive: Train/ and TEST/ are no split folders
    _write(root, "Train", _rows("a.wav"))
    _write(root, "TEST", _rows("b.wav"))


def _layout_file_name_columns(root: Path) -> None:
    _write(root, "", _rows("a.wav", "sub/b.wav", column="audio_file_name"), "jsonl")


def _layout_windows(root: Path) -> None:
    _write(root, "", _rows("sub\\a.wav", "b.wav"))


def _layout_text_and_missing(root: Path) -> None:
    rows = [{"file_name": f"{i}.wav", "caption": c} for i, c in enumerate(["NaN", "nan", "", "N/A", "ok", "None"])]
    _write(root, "", rows)


def _layout_u2028(root: Path) -> None:
    _write(root, "", [{"file_name": "a.wav", "caption": "line\u2028sep\x85nel"}, *_rows("b.wav")], "jsonl")
    (root / "metadata.jsonl").write_text(
        (root / "metadata.jsonl").read_text().replace("\\u2028", "\u2028").replace("\\u0085", "\x85")
    )  # raw characters, as a UTF-8 writer with ensure_ascii=False puts them


LAYOUTS = {
    "extra/metadata.csv beside the root's": _layout_extra,
    "holdout/ and a deeper metadata file": _layout_holdout,
    "holdout/ in parquet": lambda r: _layout_holdout(r, "parquet"),
    "data/train, data/test, data/validation/part1": _layout_nested,
    "data/train, data/test in parquet": lambda r: _layout_nested(r, "parquet"),
    "train-clean/, dev_other/, my.test/": _layout_keywords,
    "Train/ and TEST/ (case-sensitive)": _layout_case,
    "an audio_file_name column": _layout_file_name_columns,
    "a Windows sub\\a.wav": _layout_windows,
    "NaN / nan / empty / N/A / None caption cells": _layout_text_and_missing,
    "raw U+2028 and U+0085 in a jsonl string": _layout_u2028,
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_tracks_captions_and_splits_equal_what_datasets_reads(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "folder"
    LAYOUTS[layout](root)
    ours, theirs = _ours(root), _theirs(root, tmp_path / "hf_cache")
    assert ours and ours == theirs


def test_no_caption_cells_are_pandas_missing_values() -> None:
    """Our list of CSV cells read as missing is pandas' own (what datasets' read_csv uses)."""
    from pandas._libs.parsers import STR_NA_VALUES

    assert PANDAS_NA == STR_NA_VALUES


def _layout_beside_train(root: Path) -> list[str]:
    _write(root, "train", _rows("a.wav"))
    _write(root, "", _rows("b.wav"))
    _write(root, "extra", _rows("c.wav"))
    return ["extra/metadata.csv", "metadata.csv"]


def _layout_hidden(root: Path) -> list[str]:
    _write(root, "", _rows("a.wav"))
    _write(root, ".old", _rows("b.wav"))
    _write(root, "__cache", _rows("c.wav"))
    return [".old/metadata.csv", "__cache/metadata.csv"]


def _layout_linked(root: Path) -> list[str]:
    _write(root, "", _rows("a.wav"))
    _write(root.parent / "elsewhere", "", _rows("b.wav"))
    (root / "linked").symlink_to(root.parent / "elsewhere")
    (root / "loop").symlink_to(root)  # a loop is walked once, never forever
    return ["linked/metadata.csv"]


def _layout_split_in_file_name(root: Path) -> list[str]:
    _write(root, "", _rows("train_01.wav", "b.wav"))
    return ["metadata.csv"]


REFUSED = {
    "metadata beside a train/ folder": _layout_beside_train,
    "hidden and __special folders": _layout_hidden,
    "a symlinked folder (and a link loop)": _layout_linked,
    "a split keyword in a file name": _layout_split_in_file_name,
}


@pytest.mark.parametrize("layout", list(REFUSED))
def test_metadata_datasets_leaves_unread_is_refused_listing_every_file(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "folder"
    unread = REFUSED[layout](root)
    with pytest.raises(SourceError, match=rf"{len(unread)} metadata file\(s\) would not be read") as e:
        read_audiofolder(root)
    assert f"({', '.join(unread)})" in str(e.value) and "\n" not in str(e.value)
    theirs = _theirs(root, tmp_path / "hf_cache")  # datasets reads fewer rows than the metadata files hold
    files = set(root.rglob("metadata.csv")) | {root / u for u in unread}
    n_rows = sum(len(p.read_text().splitlines()) - 1 for p in files)
    assert len(theirs) < n_rows or any(c is None for c in theirs.values())


def test_a_folder_in_two_splits_and_mixed_formats_are_refused(tmp_path: Path) -> None:
    _write(tmp_path / "both", "train/test", _rows("a.wav"))
    with pytest.raises(SourceError, match=r"train/test/metadata.csv lie in folders of two splits"):
        read_audiofolder(tmp_path / "both")
    _write(tmp_path / "mixed", "train", _rows("a.wav"))
    _write(tmp_path / "mixed", "test", _rows("b.wav"), "jsonl")
    with pytest.raises(SourceError, match=r"metadata files of 2 formats"):
        read_audiofolder(tmp_path / "mixed")


def test_two_audio_columns_are_refused_naming_them(tmp_path: Path) -> None:
    _write(tmp_path, "", [{"file_name": "a.wav", "vocals_file_name": "a.wav", "caption": "x"}])
    with pytest.raises(SourceError, match=r"metadata.csv: names 2 audio columns \(file_name, vocals_file_name\)"):
        read_audiofolder(tmp_path)


def test_the_split_comes_from_the_folder_datasets_names(tmp_path: Path) -> None:
    _layout_nested(tmp_path)
    assert {t.source_file: t.split for t in read_audiofolder(tmp_path)[0]} == {
        "data/train/a.wav": "train", "data/train/b.wav": "train", "data/test/c.wav": "eval",
        "data/validation/part1/d.wav": "eval",
    }  # fmt: skip


# ---- one bad row is that track's failure


def _bad_rows(root: Path) -> dict[str, str]:
    """A metadata.jsonl with one good row and one bad row per kind; returns source_file -> expected detail regex."""
    for i, name in enumerate(
        ("good.wav", "surrogate.wav", "inf.wav", "nan.wav", "deep.wav", "dup.wav", "tmp.wav", "big.wav")
    ):
        write_track(root / name, 1.0, sr=8000, channels=1, seed=i)  # each its own audio
    os.rename(root / "tmp.wav", os.fsencode(root) + b"/caf\xe9.wav")  # a Latin-1 name on disk
    (root / "loop").symlink_to("loop")  # a directory symlink loop
    deep = "[" * 5000 + "]" * 5000
    lines = [
        '{"file_name": "good.wav", "caption": "a line\u2028separator"}',
        '{"file_name": "surrogate.wav", "caption": "bad \\ud800 text"}',
        '{"file_name": "inf.wav", "caption": "x", "bpm": 1e400}',
        '{"file_name": "nan.wav", "caption": "x", "bpm": NaN}',
        f'{{"file_name": "deep.wav", "caption": "x", "tags": {deep}}}',
        '{"file_name": "dup.wav", "caption": "one"}',
        '{"file_name": "dup.wav", "caption": "two"}',
        '{"file_name": "caf\\udce9.wav", "caption": "x"}',
        '{"file_name": "loop/a.wav", "caption": "x"}',
        f'{{"file_name": "big.wav", "caption": "x", "bpm": {"9" * 5000}}}',  # over int()'s 4300 digits
        '{"file_name": "b\\u0000.wav", "caption": "x"}',
        '{"file_name": "sub/", "caption": "x"}',
    ]
    (root / "metadata.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {
        "surrogate.wav": r"metadata.jsonl:2: text .* is not UTF-8",
        "inf.wav": r"metadata.jsonl:3: has inf, which is not JSON",
        "nan.wav": r"metadata.jsonl:4: has NaN, which is not JSON.*write null",
        "deep.wav": r"metadata.jsonl:5: a value nests deeper",
        "caf\\udce9.wav": r"metadata.jsonl:8: file_name 'caf\\\\udce9.wav': the file name is not UTF-8",
        "big.wav": r"metadata.jsonl:10: has a 5000-digit integer, which is not JSON or too large to read",
        "b\\x00.wav": r"metadata.jsonl:11: file_name 'b\\x00.wav' holds a NUL character",
        "sub": r"metadata.jsonl:12: file_name 'sub/' names a folder, not an audio file",
    }


def test_each_bad_row_is_its_own_tracks_problem(tmp_path: Path) -> None:
    import re

    expected = _bad_rows(tmp_path)
    read = read_audiofolder(tmp_path)[0]
    assert [t.source_file for t in read] == ["good.wav", *list(expected)[:4], "dup.wav", "dup.wav", *list(expected)[4:5],
                                             "loop/a.wav", *list(expected)[5:]]  # fmt: skip
    tracks = {t.source_file: t for t in read}  # (the second dup.wav: the plan records it as duplicate_audio)
    for name, pattern in expected.items():
        detail = tracks[name].problem[1] if tracks[name].problem else tracks[name].metadata_error  # type: ignore[index]
        assert re.search(pattern, detail), (name, detail)
    assert {tracks[n].problem[0] for n in ("caf\\udce9.wav", "b\\x00.wav", "sub")} == {"bad_path"}  # type: ignore[index]
    assert tracks["good.wav"].metadata == {"file_name": "good.wav", "caption": "a line\u2028separator"}
    assert all(tracks[n].metadata_error is None and tracks[n].problem is None for n in ("good.wav", "loop/a.wav"))


def test_bad_rows_are_recorded_failures_and_the_rest_is_encoded(tmp_path: Path, tiny_codec: Path) -> None:
    _bad_rows(tmp_path / "mine")
    cfg = source_config("audiofolder", tmp_path / "mine", tmp_path / "set", tiny_codec,
                        segment=SegmentConfig(seconds=1.0, min_seconds=1.0), split=SplitConfig(eval_fraction=0.0),
                        max_failure_fraction=1.0)  # 10 of 11 tracks fail on purpose  # fmt: skip
    result = run_pipeline(cfg, progress=False)
    assert result.exit_code == 0
    got = samples(tmp_path / "set")
    assert sorted(got) == ["dup_0", "good_0"] and got["good_0"]["caption"] == "a line\u2028separator"
    reasons = {k: f["reason"] for k, f in failures(tmp_path / "set").items()}
    assert sorted(reasons.values()) == ["bad_metadata"] * 5 + ["bad_path"] * 3 + ["duplicate_audio", "missing_audio"]
    text = (tmp_path / "set/failures.jsonl").read_bytes()
    assert text.decode("utf-8")  # every record is UTF-8 (the Latin-1 name is shown escaped)


def test_a_nan_caption_is_no_caption_for_every_source() -> None:
    for text in ("NaN", "nan", " NaN ", "None", ""):
        assert caption_of({"description": text}, "field", "description", "", None) is None
        assert caption_of({"caption": text, "genre": "rock"}, "template", "", "{caption} genre: {genre}", None) == (
            "genre: rock"
        )
    assert caption_of({"description": "nano synth"}, "field", "description", "", None) == "nano synth"


# ---- CSV tables as pandas reads them; archives, linked folders, parquet types

CSV_TABLES = {
    "a short row": "file_name,caption,genre\na.wav,x,rock\nb.wav,y\nc.wav\n",
    "a repeated header": "file_name,caption,caption\na.wav,x,y\n",
    "repeats skipping taken names": "file_name,caption,caption,caption.1,a,a.1,a\na.wav,x,y,z,p,q,r\n",
    "an empty header cell": "file_name,,caption\na.wav,q,x\n",
}


@pytest.mark.parametrize("table", list(CSV_TABLES))
def test_csv_rows_equal_what_datasets_reads(tmp_path: Path, table: str) -> None:
    import datasets

    root = tmp_path / "folder"
    root.mkdir()
    (root / "metadata.csv").write_text(CSV_TABLES[table], encoding="utf-8")
    for i, name in enumerate(("a.wav", "b.wav", "c.wav")):
        write_track(root / name, 0.2, sr=8000, channels=1, seed=i)
    ours = {t.source_file: {k: v for k, v in t.metadata.items() if k != "file_name"} for t in read_audiofolder(root)[0]}
    loaded = datasets.load_dataset("audiofolder", data_dir=str(root), cache_dir=str(tmp_path / "hf"))["train"]
    rows = loaded.cast_column("audio", datasets.Audio(decode=False))
    theirs = {Path(r["audio"]["path"]).name: {k: v for k, v in r.items() if k != "audio"} for r in rows}
    assert ours == theirs


def test_a_csv_row_with_more_fields_than_the_header_is_refused(tmp_path: Path) -> None:
    (tmp_path / "metadata.csv").write_text("file_name,caption\na.wav,x\nb.wav,y,z\n")
    with pytest.raises(SourceError, match=r"metadata.csv:3: 3 fields, the header has 2; quote fields that hold"):
        read_audiofolder(tmp_path)  # pandas (datasets) refuses it too


def test_a_zip_archive_is_refused_naming_it(tmp_path: Path) -> None:
    import zipfile

    _write(tmp_path, "", _rows("a.wav"))
    with zipfile.ZipFile(tmp_path / "extra.ZIP", "w") as z:  # datasets would read its audio and metadata
        z.writestr("metadata.csv", "file_name,caption\nb.wav,y\n")
    with pytest.raises(SourceError, match=r"1 zip archive\(s\) \(extra.ZIP\): datasets reads .* unzip") as e:
        read_audiofolder(tmp_path)
    assert "\n" not in str(e.value)


def test_linked_folders_are_never_walked_and_lists_are_capped(tmp_path: Path) -> None:
    import time

    root = tmp_path / "folder"
    _write(root, "", _rows("a.wav"))
    (root / "rootlink").symlink_to("/")  # walked, this took 43 s
    start = time.monotonic()
    assert [t.source_file for t in read_audiofolder(root)[0]] == ["a.wav"]
    assert time.monotonic() - start < 5
    for i in range(30):
        _write(root, f".old/{i:02d}", _rows("b.wav"))
    with pytest.raises(SourceError, match=r"30 metadata file\(s\) would not be read \(.old/00/metadata.csv, .*"
                       r".old/09/metadata.csv and 20 more\)") as e:  # fmt: skip
        read_audiofolder(root)
    assert len(str(e.value)) < 1000


def test_parquet_dates_are_iso_text_and_binary_columns_are_refused(tmp_path: Path) -> None:
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    write_track(tmp_path / "a.wav", 0.2, sr=8000, channels=1)
    when = {"t": datetime.datetime(2020, 1, 31, 12, 0), "d": datetime.date(2021, 2, 3)}
    pq.write_table(
        pa.Table.from_pylist([{"file_name": "a.wav", "caption": "x", **when}]), tmp_path / "metadata.parquet"
    )
    (track,) = read_audiofolder(tmp_path)[0]
    assert track.metadata_error is None
    assert (track.metadata["t"], track.metadata["d"]) == ("2020-01-31T12:00:00", "2021-02-03")
    rows = [{"file_name": "a.wav", "caption": "x", "blob": b"\x00"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "metadata.parquet")
    with pytest.raises(SourceError, match=r"metadata.parquet: column\(s\) blob hold binary values.*drop them"):
        read_audiofolder(tmp_path)

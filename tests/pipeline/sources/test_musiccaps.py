from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.pipeline.helpers import MUSICCAPS_CSV
from tokenizer_pipeline.errors import UserError
from tokenizer_pipeline.sources.musiccaps import ClipRow, CsvError, CsvRowError, read_musiccaps_csv

HEADER = (
    "ytid,start_s,end_s,audioset_positive_labels,aspect_list,caption,author_id,is_balanced_subset,is_audioset_eval\n"
)


def test_real_csv_rows_splits_and_types() -> None:
    rows = list(read_musiccaps_csv(MUSICCAPS_CSV))
    assert len(rows) == 5521
    assert Counter(r.split for r in rows) == {"eval": 2858, "train": 2663}
    assert len({r.ytid for r in rows}) == 5521
    assert any(r.ytid.startswith("-") for r in rows)
    first = rows[0]
    assert first == ClipRow(
        ytid="-0Gj8-vB1q4", start_s=30.0, end_s=40.0,
        audioset_positive_labels=("/m/0140xf", "/m/02cjck", "/m/04rlf"),
        aspect_list=("low quality", "sustained strings melody", "soft female vocal", "mellow piano melody",
                     "sad", "soulful", "ballad"),
        caption=first.caption, author_id=4, is_balanced_subset=False, is_audioset_eval=True, split="eval", csv_row=2,
    )  # fmt: skip
    assert first.caption.startswith("The low quality recording features a ballad")
    # csv_row is the physical line a row starts on; multi-line captions make it exceed the row index
    assert rows[1].csv_row == 3 and all(b.csv_row > a.csv_row for a, b in zip(rows, rows[1:]))
    assert rows[-1].csv_row > 5522
    with pytest.raises(AttributeError):
        first.ytid = "x"  # type: ignore[misc]


def test_configurable_split_names_and_column() -> None:
    rows = list(read_musiccaps_csv(MUSICCAPS_CSV, train_name="tr", eval_name="te", eval_column="is_balanced_subset"))
    assert {r.split for r in rows} == {"tr", "te"}
    assert all((r.split == "te") == r.is_balanced_subset for r in rows)
    with pytest.raises(UserError, match="is_audioset_eval"):
        list(read_musiccaps_csv(MUSICCAPS_CSV, eval_column="caption"))


@pytest.mark.parametrize(
    ("bad_row", "column"),
    [
        ("abcdefghijk,30,40,\"/m/1\",\"['a', 'b'\",cap,4,False,True\n", "aspect_list"),
        ('abcdefghijk,thirty,40,"/m/1","[\'a\']",cap,4,False,True\n', "start_s"),
        ('abcdefghijk,30,40,"/m/1","[\'a\']",cap,4,Maybe,True\n', "is_balanced_subset"),
        ('abcdefghijk,30,40,"/m/1","__import__(\'os\')",cap,4,False,True\n', "aspect_list"),
    ],
)
def test_malformed_row_names_file_row_and_column(tmp_path: Path, bad_row: str, column: str) -> None:
    good = 'goodgoodgoo,0,10,"/m/1","[\'x\']","multi\nline caption",1,True,False\n'
    p = tmp_path / "bad.csv"
    p.write_text(HEADER + good + bad_row, encoding="utf-8")
    with pytest.raises(CsvRowError) as ei:
        list(read_musiccaps_csv(p))
    assert ei.value.csv_row == 4  # header line 1, the good row spans lines 2-3
    assert f"{p}:4" in str(ei.value) and column in str(ei.value)


def test_too_few_fields_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "short.csv"
    p.write_text(HEADER + "abcdefghijk,30,40\n", encoding="utf-8")
    with pytest.raises(CsvRowError, match=r"short.csv:2: column 'audioset_positive_labels' is missing"):
        list(read_musiccaps_csv(p))
    with pytest.raises(CsvError, match="csv="):
        list(read_musiccaps_csv(tmp_path / "nope.csv"))


def test_every_malformed_row_is_listed_before_any_work(tmp_path: Path) -> None:
    """Policy: refuse the whole CSV up front, listing every bad row (line, column) and the fix."""
    good = 'goodgoodgoo,0,10,"/m/1","[\'x\']",cap,1,True,False\n'
    bad1 = 'abcdefghijk,thirty,40,"/m/1","[\'a\']",cap,4,False,True\n'
    bad2 = 'bcdefghijkl,30,40,"/m/1","[\'a\']",cap,four,False,True\n'
    p = tmp_path / "bad.csv"
    p.write_text(HEADER + good + bad1 + good.replace("goodgoodgoo", "goodgoodgo2") + bad2, encoding="utf-8")
    with pytest.raises(CsvRowError) as ei:
        read_musiccaps_csv(p)
    e = ei.value
    assert isinstance(e, UserError) and e.csv_row == 3 and [n for n, _ in e.problems] == [3, 5]
    msg = str(e)
    assert "line 3: column 'start_s'" in msg and "line 5: column 'author_id'" in msg
    assert "2 malformed row(s)" in msg and "nothing was encoded" in msg and "Fix or delete these rows" in msg


def test_unreadable_csv_is_a_user_error(tmp_path: Path) -> None:
    p = tmp_path / "latin1.csv"
    p.write_bytes((HEADER + 'abcdefghijk,30,40,"/m/1","[\'a\']",caf\xe9,4,False,True\n').encode("latin-1"))
    with pytest.raises(CsvError, match="save the CSV as UTF-8"):
        read_musiccaps_csv(p)
    d = tmp_path / "a_directory.csv"
    d.mkdir()
    with pytest.raises(CsvError, match="not found"):
        read_musiccaps_csv(d)


def test_cli_prints_csv_errors_without_traceback(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    csv_path, audio_dir, _ = corpus
    bad = tmp_path / "bad.csv"
    lines = csv_path.read_text(encoding="utf-8").splitlines(keepends=True)
    bad.write_text(lines[0] + lines[1].replace(",False,", ",Maybe,", 1), encoding="utf-8")
    r = subprocess.run(
        [sys.executable, "-m", "tokenizer_pipeline", f"csv={bad}", f"audio_dir={audio_dir}", f"out_dir={tmp_path / 'o'}",
         f"codec.name_or_path={tiny_codec}", "codec.device=cpu"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: {bad}:2: column 'is_balanced_subset'") and "Fix or delete" in r.stderr
    assert not (tmp_path / "o").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("start", "end", "column"),
    [("-5", "5", "start_s"), ("nan", "10", "start_s"), ("0", "nan", "end_s"), ("30", "inf", "end_s"),
     ("-inf", "10", "start_s"), ("30", "1e999", "end_s"), ("40", "30", "end_s=30.0 is not after")],
)  # fmt: skip
def test_windows_that_are_not_finite_non_negative_and_ordered_are_refused(tmp_path: Path, start, end, column) -> None:
    good = 'goodgoodgoo,0,10,"/m/1","[\'x\']",cap,1,True,False\n'
    p = tmp_path / "w.csv"
    p.write_text(HEADER + good + f'abcdefghijk,{start},{end},"/m/1","[\'a\']",cap,4,False,True\n', encoding="utf-8")
    with pytest.raises(CsvRowError) as ei:
        read_musiccaps_csv(p)
    assert ei.value.csv_row == 3 and f"{p}:3" in str(ei.value) and column in str(ei.value)


def test_a_csv_saved_with_a_byte_order_mark_reads(tmp_path: Path) -> None:
    text = HEADER + 'goodgoodgoo,0,10,"/m/1","[\'x\']",cap,1,True,False\n'
    p = tmp_path / "bom.csv"
    p.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert [(r.ytid, r.csv_row) for r in read_musiccaps_csv(p)] == [("goodgoodgoo", 2)]


def test_a_bad_byte_is_reported_on_its_own_line(tmp_path: Path) -> None:
    good = 'goodgoodgo{},0,10,"/m/1","[\'x\']",cap,1,True,False\n'
    bad = 'abcdefghijk,30,40,"/m/1","[\'a\']",caf\xe9,4,False,True\n'.encode("latin-1")
    p = tmp_path / "byte.csv"
    p.write_bytes((HEADER + good.format(1)).encode() + bad + "".join(good.format(i) for i in range(2, 400)).encode())
    with pytest.raises(CsvError, match=rf"^{p}:3: not UTF-8 text"):
        read_musiccaps_csv(p)


@pytest.mark.parametrize("name", ["../escape", "/abs/dir", "", ".", "..", "a/b", "a.b"])
def test_split_names_must_be_plain_names(name: str) -> None:
    for kw in ({"train_name": name}, {"eval_name": name}):
        with pytest.raises(UserError, match=r"split\.(train|eval)_name=.* plain directory name"):
            read_musiccaps_csv(MUSICCAPS_CSV, **kw)


@pytest.mark.parametrize("window", ["-30,-20", "nan,10", "30,inf"])
def test_make_audio_refuses_the_same_windows_before_fetching(tmp_path: Path, window: str) -> None:
    """`make audio` parses the CSV with the same reader: a negative start used to crash it with a traceback."""
    from tokenizer_pipeline.fetch.config import DownloadConfig
    from tokenizer_pipeline.fetch.download import run_download

    p = tmp_path / "w.csv"
    p.write_text(HEADER + f'abcdefghijk,{window},"/m/1","[\'a\']",cap,4,False,True\n', encoding="utf-8")
    with pytest.raises(CsvRowError, match=rf"{p}:2: column '(start|end)_s'"):
        run_download(DownloadConfig(csv=str(p), out_dir=str(tmp_path / "out")), progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("blank", ["\n", "\r\n", "\n\n"])
def test_a_row_after_blank_lines_is_reported_on_its_own_line(tmp_path: Path, blank: str) -> None:
    """csv skips blank lines; the line number must still be the line the bad row is on."""
    good = 'goodgoodgoo,0,10,"/m/1","[\'x\']","multi\nline caption",1,True,False\n'
    bad = 'abcdefghijk,-1,40,"/m/1","[\'a\']",cap,4,False,True\n'
    p = tmp_path / "blank.csv"
    p.write_text(HEADER + good + blank + bad, encoding="utf-8", newline="")
    want = 4 + blank.count("\n")  # header 1, the good row 2-3, then the blank lines
    with pytest.raises(CsvRowError) as ei:
        read_musiccaps_csv(p)
    assert ei.value.csv_row == want and f"{p}:{want}:" in str(ei.value)
    rows = read_musiccaps_csv(_without_bad(p, bad))
    assert [r.csv_row for r in rows] == [2]


def _without_bad(p: Path, bad: str) -> Path:
    p.write_text(p.read_text(encoding="utf-8").replace(bad, ""), encoding="utf-8", newline="")
    return p

"""The planning rules on their own: segment windows, track ids, hash splits, audiocraft-compatible captions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tokenizer_pipeline.config import SegmentConfig
from tokenizer_pipeline.errors import ConfigError
from tokenizer_pipeline.shards.keys import MAX_KEY_LEN, key_problem
from tokenizer_pipeline.sources.captions import aspects_of, caption_of, fill_template
from tokenizer_pipeline.sources.segmenting import Segmentation, plan_windows
from tokenizer_pipeline.sources.splits import is_eval, track_unit
from tokenizer_pipeline.sources.track_ids import MAX_TRACK_ID_LEN, track_ids

SR = 44100


def _spans(n_seconds: float, seconds: float = 10.0, hop: float | None = None, low: float | None = None):
    windows, dropped = plan_windows(round(n_seconds * SR), SR, Segmentation.from_config(seconds, hop, low))
    return [(w.index, w.start_s, w.end_s) for w in windows], dropped


def test_windows_full_segments_then_a_kept_or_dropped_tail() -> None:
    assert _spans(30.0) == ([(0, 0.0, 10.0), (1, 10.0, 20.0), (2, 20.0, 30.0)], 0)
    assert _spans(25.0) == ([(0, 0.0, 10.0), (1, 10.0, 20.0)], 1)  # 5-s tail < 8 s (0.8 x 10)
    assert _spans(28.5) == ([(0, 0.0, 10.0), (1, 10.0, 20.0), (2, 20.0, 28.5)], 0)  # 8.5-s tail kept, shorter
    assert _spans(7.0) == ([], 1)  # shorter than min_seconds: no segment
    assert _spans(9.0) == ([(0, 0.0, 9.0)], 0)
    assert _spans(25.0, low=0.0) == ([(0, 0.0, 10.0), (1, 10.0, 20.0), (2, 20.0, 25.0)], 0)


def test_windows_with_overlap_stop_at_the_first_tail() -> None:
    spans, dropped = _spans(22.0, hop=5.0)
    assert spans == [(0, 0.0, 10.0), (1, 5.0, 15.0), (2, 10.0, 20.0)] and dropped == 1  # [15, 22] is 7 s < 8 s
    assert _spans(24.0, hop=5.0)[0][-1] == (3, 15.0, 24.0)


def test_full_windows_have_exactly_equal_sample_counts() -> None:
    windows, _ = plan_windows(1_323_001, SR, Segmentation.from_config(10.0, None, None))  # 30.00002 s
    assert {w.stop - w.start for w in windows} == {441_000}


@pytest.mark.parametrize(
    "seconds, hop, low", [(0, None, None), (10, -1, None), (10, None, 11), (float("nan"), None, None)]
)
def test_bad_segment_settings_are_refused(seconds: float, hop, low) -> None:
    with pytest.raises(ConfigError, match="segment"):
        Segmentation.from_config(seconds, hop, low)


def test_track_ids_are_safe_unique_and_never_shaped_like_a_segment_key() -> None:
    paths = ["a/b c.wav", "a_b_c.flac", "x_1.wav", "x.wav", "song.mp3", "song.wav", "é.wav", "d/" + "y" * 200 + ".wav"]
    ids = track_ids(paths)
    assert len(set(ids)) == len(ids)
    assert all(key_problem(f"{i}_999999999") is None and len(i) <= MAX_TRACK_ID_LEN for i in ids)
    assert not any(re.search(r"_\d+$", i) for i in ids)  # so '<id>_<n>' is never another track's id
    assert ids[2] == "x-1" and ids[3] == "x" and re.fullmatch(r"track-[0-9a-f]{8}", ids[6])  # not ASCII: hashed
    assert ids[0] != ids[1] and ids[0].startswith("a_b_c-") and ids[4].startswith("song-")  # collisions: hash suffix
    assert track_ids(list(reversed(paths))) == list(reversed(ids))  # order never matters
    assert MAX_TRACK_ID_LEN + len("_999999999") == MAX_KEY_LEN


def test_split_by_hash_is_stable_when_tracks_are_added() -> None:
    few = track_ids([f"t{i}.wav" for i in range(200)])
    many = track_ids([f"t{i}.wav" for i in range(200)] + [f"new/{i}.wav" for i in range(500)])
    assert few == many[:200]
    assert [is_eval(t, 0.1) for t in few] == [is_eval(t, 0.1) for t in many[:200]]
    share = sum(is_eval(t, 0.1) for t in many) / len(many)
    assert 0.06 < share < 0.14  # about eval_fraction (binomial, 700 tracks: sd 0.011)
    assert all(0 <= track_unit(t) < 1 for t in many)
    assert not any(is_eval(t, 0.0) for t in many) and all(is_eval(t, 1.0) for t in many)


META = {"description": " A song. ", "genre": "Rock", "bpm": "120.0", "key": "C Major", "moods": "happy, sad",
        "keywords": ["Guitar", "", "drums"], "instrument": "None", "title": ""}  # fmt: skip


def test_template_fields_are_normalised_as_audiocraft_does() -> None:
    t = "{description} genre: {genre}. bpm: {bpm}. key: {key}. moods: {moods}. by {artist}"
    assert fill_template(t, META) == "A song. genre: rock. bpm: 120. key: c major. moods: happy, sad"
    assert fill_template(t, {"bpm": 92.5}) == "bpm: 92.5"
    assert fill_template(t, {"key": "C major, G major"}) is None  # several keys: dropped (audiocraft); nothing left
    assert fill_template("{description}", {"description": "None"}) is None


def test_caption_field_and_aspects() -> None:
    assert caption_of(META, "field", "description", "", None) == "A song."
    assert caption_of({"text": "t"}, "field", "caption", "", "text") == "t"
    assert caption_of({"caption": "", "text": "t"}, "field", "caption", "", "text") is None  # the column exists
    assert aspects_of(META, ["keywords", "genre", "moods", "instrument"]) == ["guitar", "drums", "rock", "happy", "sad"]
    assert aspects_of({"aspect_list": "['a b', 'c']"}, ["aspect_list"]) == ["a b", "c"]


def test_a_track_keeps_its_split_when_a_colliding_track_is_added(tmp_path: Path) -> None:
    """'a b.wav' added next to 'a_b.flac' turns both ids into hashed ones; the old track must not change split
    (found by review: with eval_fraction=0.1, 'a_b.flac' moved from train to eval, a held-out leak)."""
    from tests.pipeline.sources.helpers import make_audiocraft, source_config
    from tokenizer_pipeline.sources.plan import plan_items

    meta = {"description": "x"}
    before = make_audiocraft(tmp_path / "one", [{"name": "a_b.flac", "seconds": 0.5, "sidecar": meta}])
    after = make_audiocraft(tmp_path / "two", [{"name": "a_b.flac", "seconds": 0.5, "sidecar": meta},
                                               {"name": "a b.wav", "seconds": 0.5, "sidecar": meta}])  # fmt: skip
    seg = SegmentConfig(seconds=0.5)
    split_of = {}
    for name, manifest in (("before", before), ("after", after)):
        items, _ = plan_items(source_config("audiocraft", manifest, tmp_path / "set", tmp_path, segment=seg))
        split_of[name] = {i.source_file: i.split for i in items}
    assert split_of["before"]["a_b.flac"] == split_of["after"]["a_b.flac"]


def test_escaped_braces_in_a_template_stay_literal_text() -> None:
    """'{{' / '}}' are str.format's literal braces; they used to swallow the text before them ('A By}')."""
    assert fill_template("{a} x {{y}} {b}", {"a": "A", "b": "B"}) == "A x {y} B"
    assert fill_template("{a} {{raw}}", {"a": "A"}) == "A {raw}"
    assert fill_template("{a} x {{y}} {b}", {"b": "B"}) == "x {y} B"  # b owns all the text since the field before it

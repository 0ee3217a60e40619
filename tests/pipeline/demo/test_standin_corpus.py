"""Stand-in corpus: deterministic, right format, verbatim CSV subset, audio that follows the caption."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests import REPO
from tokenizer_pipeline.demo.standin_attributes import ClipAttributes, derive_attributes, parse_aspects
from tokenizer_pipeline.demo.standin_corpus import SUBSET_CSV, build_corpus
from tokenizer_pipeline.demo.standin_render import SAMPLE_RATE, render_clip

CSV = REPO / "data" / "musiccaps" / "musiccaps-public.csv"
N_CLIPS = 16


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.fixture(scope="session")
def corpus_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    a, b = tmp_path_factory.mktemp("corpus_a"), tmp_path_factory.mktemp("corpus_b")
    build_corpus(CSV, a, N_CLIPS, eval_fraction=0.25, seed=0)
    build_corpus(CSV, b, N_CLIPS, eval_fraction=0.25, seed=0, workers=2)  # rendered in 2 processes: same bytes
    return a, b


def _spectrum_stats(x: np.ndarray) -> tuple[float, float, float]:
    """(spectral centroid Hz, onsets per second, noise floor dB) of a mono float signal."""
    hop, win = 512, 2048
    frames = np.lib.stride_tricks.sliding_window_view(x, win)[::hop] * np.hanning(win)  # [F, win]
    mag = np.abs(np.fft.rfft(frames, axis=1))  # [F, win//2+1]
    freqs = np.fft.rfftfreq(win, 1.0 / SAMPLE_RATE)
    centroid = float((mag * freqs).sum() / mag.sum())
    flux = np.maximum(np.diff(np.log1p(mag), axis=0), 0).sum(axis=1)  # [F-1]
    peaks = (flux[1:-1] > flux[:-2]) & (flux[1:-1] >= flux[2:]) & (flux[1:-1] > flux.mean() + flux.std())
    onsets = float(peaks.sum()) / (len(x) / SAMPLE_RATE)
    floor = float(np.median(20 * np.log10(np.percentile(mag, 10, axis=1) + 1e-9)))  # spectral valleys
    return centroid, onsets, floor


def test_deterministic_bytes_with_any_number_of_workers(corpus_dirs: tuple[Path, Path]) -> None:
    a, b = corpus_dirs
    da, db = _digest(a), _digest(b)
    assert da == db
    assert len([n for n in da if n.endswith(".wav")]) == N_CLIPS


def test_wav_format_and_split(corpus_dirs: tuple[Path, Path]) -> None:
    a, _ = corpus_dirs
    meta = json.loads((a / "corpus.json").read_text())
    assert meta["n_clips"] == N_CLIPS and meta["n_eval"] == 4 and meta["n_train"] == 12
    assert "synthetic stand-in" in meta["note"].lower()
    for clip in meta["clips"]:
        info = sf.info(str(a / clip["file"]))
        assert (info.samplerate, info.channels, info.subtype, info.format) == (44_100, 1, "PCM_16", "WAV")
        assert info.frames == 10 * 44_100
        x, _ = sf.read(str(a / clip["file"]), dtype="float32")
        assert 0.5 < np.abs(x).max() < 0.95  # peak-normalised to -1 dBFS, no clipping
        for key in ("family", "bpm", "mode", "noise", "drums", "register"):
            assert key in clip


def test_subset_csv_rows_verbatim(corpus_dirs: tuple[Path, Path]) -> None:
    a, _ = corpus_dirs
    with CSV.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader)
        full = {row[0]: row for row in reader}
    with (a / "musiccaps-subset.csv").open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        assert next(reader) == header
        subset = list(reader)
    assert len(subset) == N_CLIPS
    for row in subset:
        assert row == full[row[0]]  # every column, verbatim
        assert (a / f"{row[0]}.wav").is_file()
    evals = [r[header.index("is_audioset_eval")] for r in subset]
    assert evals.count("True") == 4 and evals.count("False") == 12


def test_attribute_table() -> None:
    a = derive_attributes(
        parse_aspects("['low quality', 'sustained strings melody', 'soft female vocal', 'sad', 'ballad']")
    )
    assert (a.family, a.mode, a.tempo, a.noise, a.register, a.drums) == (
        "strings",
        "minor",
        "slow",
        True,
        "high",
        False,
    )
    b = derive_attributes(parse_aspects("['bass guitar', 'fast tempo', 'punchy kick', 'happy', 'no voices']"))
    assert (b.family, b.mode, b.bpm, b.drums, b.register, b.noise) == ("bass", "major", 140.0, True, "low", False)
    c = derive_attributes(parse_aspects("['no percussion', 'no voices', 'organ']"))
    assert (c.family, c.drums, c.mode, c.bpm) == ("organ", False, "neutral", 100.0)


def _attrs(**kw: object) -> ClipAttributes:
    base = dict(
        family="piano",
        bass_line=False,
        tempo="medium",
        bpm=100.0,
        mode="major",
        tonic_midi=60,
        register="mid",
        drums=False,
        noise=False,
        matched={},
    )
    base.update(kw)
    return ClipAttributes(**base)  # type: ignore[arg-type]


def test_audio_follows_caption() -> None:
    """A "fast drums" row sounds brighter and busier than a "slow piano" row."""
    fast = derive_attributes(parse_aspects("['electric guitar', 'fast tempo', 'acoustic drums', 'energetic']"))
    slow = derive_attributes(parse_aspects("['mellow piano melody', 'slow tempo', 'calm']"))
    assert fast.drums and fast.bpm == 140.0 and not slow.drums and slow.bpm == 70.0
    c_fast, on_fast, _ = _spectrum_stats(render_clip(fast, "aaaaaaaaaaa"))
    c_slow, on_slow, _ = _spectrum_stats(render_clip(slow, "aaaaaaaaaaa"))
    assert c_fast > 1.5 * c_slow, (c_fast, c_slow)
    assert on_fast > 1.5 * on_slow, (on_fast, on_slow)


def test_tempo_sets_onset_rate() -> None:
    _, on_fast, _ = _spectrum_stats(render_clip(_attrs(family="guitar", bpm=140.0), "bbbbbbbbbbb"))
    _, on_slow, _ = _spectrum_stats(render_clip(_attrs(family="guitar", bpm=70.0), "bbbbbbbbbbb"))
    assert on_fast > 1.5 * on_slow, (on_fast, on_slow)


def test_families_have_distinct_spectra() -> None:
    cents = {
        f: _spectrum_stats(render_clip(_attrs(family=f), "ccccccccccc"))[0]
        for f in ("wind", "organ", "strings", "brass", "bass")
    }
    assert cents["bass"] < cents["wind"] < cents["strings"], cents
    assert cents["wind"] < cents["brass"], cents
    assert len({round(c, -1) for c in cents.values()}) == len(cents)


def test_noise_keyword_raises_noise_floor() -> None:
    for fam in ("piano", "organ", "vocal"):
        _, _, clean = _spectrum_stats(render_clip(_attrs(family=fam), "ddddddddddd"))
        _, _, noisy = _spectrum_stats(render_clip(_attrs(family=fam, noise=True), "ddddddddddd"))
        assert noisy > clean + 10.0, (fam, clean, noisy)


def test_per_clip_randomness_is_ytid_seeded() -> None:
    a = render_clip(_attrs(), "eeeeeeeeeee")
    assert np.array_equal(a, render_clip(_attrs(), "eeeeeeeeeee"))
    assert not np.allclose(a, render_clip(_attrs(), "fffffffffff"))


def test_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="musiccaps-public.csv"):
        build_corpus(tmp_path / "missing.csv", tmp_path / "out", 4)
    with pytest.raises(ValueError, match="lower --n-clips"):
        build_corpus(CSV, tmp_path / "out", 100_000)


@pytest.mark.parametrize("layout", ["audiocraft", "audiofolder"])
def test_layouts_are_read_by_their_sources(tmp_path: Path, layout: str) -> None:
    """--layout writes full-length stereo tracks that source=<layout> reads: every clip, its caption, its split."""
    from tokenizer_pipeline.config import PipelineConfig, SegmentConfig, SourceConfig
    from tokenizer_pipeline.sources.plan import plan_items

    corpus = build_corpus(CSV, tmp_path / "c", n_clips=4, duration_s=3.0, layout=layout, sample_rate=44100, channels=2)
    captions = {r["ytid"]: r["caption"] for r in csv.DictReader((tmp_path / "c" / SUBSET_CSV).open(encoding="utf-8"))}
    for clip in corpus["clips"]:
        info = sf.info(str(tmp_path / "c" / clip["file"]))
        assert (info.channels, info.samplerate, info.frames) == (2, 44100, 3 * 44100)
    where = {"audiocraft": {"manifest": str(tmp_path / "c/data.jsonl")}, "audiofolder": {"dir": str(tmp_path / "c")}}
    src = SourceConfig(
        kind=layout, caption_column="description" if layout == "audiocraft" else "caption", **where[layout]
    )
    items, info = plan_items(PipelineConfig(audio_dir=None, source=src, segment=SegmentConfig(seconds=1.5)))
    assert info.n_tracks == 4 and len(items) == 8 and all(i.failure is None for i in items)
    by_track = {Path(i.source_path).stem: i for i in items if i.segment_index == 0}  # ytid -> its first segment
    assert {t: i.caption for t, i in by_track.items()} == {y: captions[y] for y in by_track}
    if layout == "audiofolder":  # split folders from the rows' is_audioset_eval
        assert {t: i.split for t, i in by_track.items()} == {c["ytid"]: c["split"] for c in corpus["clips"]}

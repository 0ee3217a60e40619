"""Embedded offline default, step 1: a synthetic stand-in for MusicCaps audio, rendered from the captions.

A deterministic subset of the real CSV rows, each rendered as a clip whose sound is a fixed function of its
`aspect_list` keywords (standin_attributes, standin_render) plus a melody seeded from the ytid. It is NOT MusicCaps
music. `--out` holds `{ytid}.wav`, `musiccaps-subset.csv` (the rows verbatim) and `corpus.json`; other layouts:
standin_layouts.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import soundfile as sf

from ..errors import ConfigError, InputNotFoundError
from .standin_attributes import derive_attributes, parse_aspects
from .standin_layouts import LAYOUTS, LayoutWriter
from .standin_render import DURATION_S, SAMPLE_RATE, render_clip, to_pcm16

LAYOUT_DURATION_S = 30.0  # --layout audiocraft|audiofolder: full-length tracks, cut into segments by the pipeline
SUBSET_CSV = "musiccaps-subset.csv"
CORPUS_JSON = "corpus.json"
STANDIN_NOTE = (
    "Synthetic stand-in audio: MusicCaps publishes captions and YouTube ids but no audio, and this offline "
    "demo cannot download any. Each clip here is rendered by tokenizer_pipeline.standin_corpus from the "
    "row's aspect_list keywords (instrument family -> timbre, tempo words -> note rate, mood -> scale, "
    "quality words -> noise and band-limiting, percussion words -> a drum grid, register words -> octave) "
    "with a melody seeded from the ytid. The captions are real MusicCaps text; the audio is not the "
    "recording they describe, and nothing learned from it says anything about real music."
)


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]], list[int]]:
    """(header, rows, 1-based start line of each row)."""
    if not path.is_file():
        raise InputNotFoundError(
            f"MusicCaps CSV not found: {path} (the repo ships it at data/musiccaps/musiccaps-public.csv)"
        )
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        missing = {"ytid", "aspect_list", "is_audioset_eval"} - set(header)
        if missing:
            raise ConfigError(f"{path}: missing column(s) {sorted(missing)}; expected the MusicCaps header {header}")
        rows, lines = [], []
        prev_end = reader.line_num  # 1 after the header
        for row in reader:
            rows.append(row)
            lines.append(prev_end + 1)
            prev_end = reader.line_num
    return header, rows, lines


def n_eval_rows(n_clips: int, eval_fraction: float) -> int:
    """How many of n_clips rows are held out (the rule `select_rows` and `check_built` share)."""
    return int(round(n_clips * eval_fraction))


def select_rows(rows: list[dict[str, str]], n_clips: int, eval_fraction: float, seed: int) -> list[int]:
    """Indices (CSV order) of n_clips rows: round(n*eval_fraction) eval rows, the rest train, by seeded hash."""
    if n_clips < 1:
        raise ConfigError(f"--n-clips must be >= 1, got {n_clips}")
    if not 0.0 <= eval_fraction <= 1.0:
        raise ConfigError(f"--eval-fraction must be in [0, 1], got {eval_fraction}")
    n_eval = n_eval_rows(n_clips, eval_fraction)
    picked: list[int] = []
    for flag, want in (("True", n_eval), ("False", n_clips - n_eval)):
        pool = [i for i, r in enumerate(rows) if r["is_audioset_eval"] == flag]
        if want > len(pool):
            raise ConfigError(
                f"asked for {want} rows with is_audioset_eval={flag} but the CSV has {len(pool)}; "
                f"lower --n-clips or change --eval-fraction"
            )
        pool.sort(key=lambda i: hashlib.sha256(f"{seed}:{rows[i]['ytid']}".encode()).hexdigest())
        picked.extend(pool[:want])
    return sorted(picked)


def build_corpus(
    csv_path: Path, out: Path, n_clips: int, eval_fraction: float = 0.25, seed: int = 0, duration_s: float = DURATION_S,
    layout: str = "musiccaps", sample_rate: int = SAMPLE_RATE, channels: int = 1, workers: int = 1,
) -> dict:  # fmt: skip
    """Select rows, render and write every clip, the subset CSV and corpus.json. Returns the corpus.json dict.

    `layout` other than musiccaps writes the clips as full-length tracks in that layout (standin_layouts.py).
    `workers` > 1 renders musiccaps-layout clips in that many processes; every clip is a function of its row,
    ytid, seed and duration only, so the bytes do not depend on it.
    """
    if duration_s <= 0:
        raise ConfigError(f"--duration-s must be > 0, got {duration_s}")
    if layout not in LAYOUTS or sample_rate < 8000 or channels not in (1, 2):
        raise ConfigError(f"--layout {layout} (one of {LAYOUTS}), --sample-rate {sample_rate} (>= 8000) and "
                          f"--channels {channels} (1 or 2): a value is out of range")  # fmt: skip
    if layout == "musiccaps" and (sample_rate != SAMPLE_RATE or channels != 1):
        raise ConfigError("--sample-rate and --channels apply to --layout audiocraft|audiofolder only")
    header, rows, lines = _read_csv(csv_path)
    idx = select_rows(rows, n_clips, eval_fraction, seed)
    out.mkdir(parents=True, exist_ok=True)
    layout_writer = None if layout == "musiccaps" else LayoutWriter(layout, out, sample_rate, channels, duration_s)
    for i in idx:  # every id checked before any clip is rendered
        if not re.fullmatch(r"[A-Za-z0-9_-]+", rows[i]["ytid"]):
            raise ConfigError(
                f"{csv_path}:{lines[i]}: ytid {rows[i]['ytid']!r} is not a YouTube id; cannot name {rows[i]['ytid']}.wav"
            )
    if layout_writer is None and workers > 1:
        jobs = [(rows[i]["aspect_list"], rows[i]["ytid"], seed, duration_s, str(out)) for i in idx]
        with ProcessPoolExecutor(max_workers=workers) as pool:
            list(pool.map(_render_musiccaps_clip, jobs, chunksize=4))
    clips = []
    for i in idx:
        row = rows[i]
        ytid = row["ytid"]
        attrs = derive_attributes(parse_aspects(row["aspect_list"]))
        split = "eval" if row["is_audioset_eval"] == "True" else "train"
        if layout_writer is not None:
            audio = render_clip(attrs, ytid, seed, duration_s)  # [duration_s * SAMPLE_RATE]
            aspects = parse_aspects(row["aspect_list"])
            file = layout_writer.add(row, aspects, asdict(attrs), audio, SAMPLE_RATE, split)
        else:
            if workers <= 1:
                _render_musiccaps_clip((row["aspect_list"], ytid, seed, duration_s, str(out)))
            file = f"{ytid}.wav"
        clips.append(
            {
                "ytid": ytid,
                "file": file,
                "split": split,
                "source_csv_row": lines[i],
                **asdict(attrs),
            }
        )
    with (out / SUBSET_CSV).open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows[i] for i in idx)
    corpus = {
        "note": STANDIN_NOTE,
        "generator": "tokenizer_pipeline.standin_corpus",
        "source_csv": csv_path.name,
        "subset_csv": SUBSET_CSV,
        "sample_rate": sample_rate,
        "duration_s": duration_s,
        "seed": seed,
        "n_clips": len(clips),
        "n_train": sum(c["split"] == "train" for c in clips),
        "n_eval": sum(c["split"] == "eval" for c in clips),
        "clips": clips,
    }
    if layout_writer is not None:
        corpus |= {"layout": layout, "channels": channels, "layout_files": layout_writer.close()}
    (out / CORPUS_JSON).write_text(json.dumps(corpus, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return corpus


def _render_musiccaps_clip(job: tuple[str, str, int, float, str]) -> None:
    """Render one row's clip and write `{ytid}.wav` through a temp file (a worker process's unit of work)."""
    aspect_list, ytid, seed, duration_s, out = job
    audio = render_clip(derive_attributes(parse_aspects(aspect_list)), ytid, seed, duration_s)  # [T]
    tmp = Path(out) / f".{ytid}.wav.tmp"
    sf.write(str(tmp), to_pcm16(audio), SAMPLE_RATE, subtype="PCM_16", format="WAV")
    tmp.replace(Path(out) / f"{ytid}.wav")

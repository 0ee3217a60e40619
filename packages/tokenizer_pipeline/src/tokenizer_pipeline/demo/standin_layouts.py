"""The stand-in corpus written as your-own-audio layouts (`--layout audiocraft|audiofolder`).

audiocraft: `audio/<ytid>.wav` + MusicInfo sidecar `.json` + `data.jsonl`; audiofolder: `train/` and `test/` with
wavs and a metadata.csv. Tracks are full length; stereo's right channel is the left one 10 ms later at 0.9 gain.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

LAYOUTS = ("musiccaps", "audiocraft", "audiofolder")
KEY_NAMES = {"major": "C major", "minor": "A minor", "neutral": "D major"}  # standin_attributes.SCALES' tonics
AUDIOFOLDER_COLUMNS = ("file_name", "caption", "aspect_list", "ytid")


def to_layout_audio(x: np.ndarray, from_sr: int, sample_rate: int, channels: int) -> np.ndarray:
    """Mono float `[N]` at `from_sr` -> int16 `[N', channels]` at `sample_rate`."""
    if sample_rate != from_sr:
        x = soxr.resample(x, from_sr, sample_rate, quality="VHQ")  # [N] -> [N']
    cols = [x] if channels == 1 else [x, 0.9 * np.concatenate([np.zeros(sample_rate // 100), x])[: len(x)]]
    y = np.stack(cols + [x] * max(0, channels - 2), axis=1)  # [N', C]
    return np.clip(np.round(y * 32767.0), -32768, 32767).astype(np.int16)


def sidecar(row: dict[str, str], aspects: list[str], attrs: dict, duration_s: float, sample_rate: int) -> dict:
    """audiocraft's MusicInfo fields for one track."""
    return {
        "title": "", "artist": "", "key": KEY_NAMES[attrs["mode"]], "bpm": attrs["bpm"], "genre": "",
        "moods": [], "keywords": aspects, "description": row["caption"], "name": row["ytid"],
        "instrument": attrs["family"], "sample_rate": sample_rate, "file_extension": "wav", "duration": duration_s,
    }  # fmt: skip


class LayoutWriter:
    """Writes one rendered clip at a time (memory: one track), then the manifest / metadata files on `close`."""

    def __init__(self, layout: str, out: Path, sample_rate: int, channels: int, duration_s: float) -> None:
        self.layout, self.out, self.sample_rate, self.channels = layout, out, sample_rate, channels
        self.duration_s = duration_s
        self.lines: list[str] = []
        self.rows: dict[str, list[dict[str, str]]] = {"train": [], "test": []}

    def add(
        self, row: dict[str, str], aspects: list[str], attrs: dict, audio: np.ndarray, from_sr: int, split: str
    ) -> str:
        """Write one track (`audio`: mono float `[N]` at `from_sr`); returns its path relative to `out`."""
        folder = "audio" if self.layout == "audiocraft" else ("train" if split == "train" else "test")
        rel = f"{folder}/{row['ytid']}.wav"
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(str(path), to_layout_audio(audio, from_sr, self.sample_rate, self.channels), self.sample_rate,
                 subtype="PCM_16", format="WAV")  # fmt: skip
        if self.layout == "audiocraft":
            meta = sidecar(row, aspects, attrs, self.duration_s, self.sample_rate)
            path.with_suffix(".json").write_text(json.dumps(meta, allow_nan=False) + "\n", encoding="utf-8")
            line = {"path": str(path.absolute()), "duration": self.duration_s, "sample_rate": self.sample_rate, "amplitude": None,
                    "weight": None, "info_path": None}  # fmt: skip
            self.lines.append(json.dumps(line, allow_nan=False))
        else:
            self.rows[folder].append(
                {"file_name": f"{row['ytid']}.wav", "caption": row["caption"], "aspect_list": ", ".join(aspects),
                 "ytid": row["ytid"]}
            )  # fmt: skip
        return rel

    def close(self) -> list[str]:
        """Write data.jsonl (audiocraft) or each split's metadata.csv (audiofolder); returns their relative paths."""
        if self.layout == "audiocraft":
            (self.out / "data.jsonl").write_text("".join(f"{x}\n" for x in self.lines), encoding="utf-8")
            return ["data.jsonl"]
        written = []
        for folder, rows in self.rows.items():
            if rows:
                with (self.out / folder / "metadata.csv").open("w", newline="", encoding="utf-8") as f:
                    w = csv.DictWriter(f, fieldnames=AUDIOFOLDER_COLUMNS, lineterminator="\n")
                    w.writeheader()
                    w.writerows(rows)
                written.append(f"{folder}/metadata.csv")
        return written

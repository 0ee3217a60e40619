"""Embedded offline default, step 1: a synthetic stand-in for MusicCaps audio, rendered from the captions.

MusicCaps ships metadata only; its audio lives on YouTube and cannot be fetched offline. This module picks
a deterministic subset of the real CSV rows and renders, for each row, a 10-s clip whose sound is a fixed
function of the row's `aspect_list` keywords (plus a melody seeded from the ytid), so that a downstream
model has something caption-dependent to learn. It is NOT music from MusicCaps.

    python -m tokenizer_pipeline.standin_corpus --csv data/musiccaps/musiccaps-public.csv \\
        --out build/demo/corpus --n-clips 320 [--eval-fraction 0.25] [--seed 0]
        [--layout audiocraft|audiofolder --duration-s 30 --sample-rate 44100 --channels 2]   (standin_layouts.py)

Output (`--out`):
    {ytid}.wav              44.1 kHz, 16-bit PCM, mono, 10 s (like a yt-dlp download of the window)
    musiccaps-subset.csv    the selected rows, original header, columns and values verbatim, CSV order
    corpus.json             per clip: the attributes the renderer derived and the keywords that set them

Keyword -> attribute table. Aspects are matched lowercase, as whole words/phrases; an aspect that starts
with "no "/"without " (e.g. "no voices", "no percussion") is a negation and switches nothing on.

| attribute  | keywords (first match wins where noted)                                  | effect                      |
| ---------- | ------------------------------------------------------------------------ | --------------------------- |
| family     | first aspect (in list order) naming an instrument; inside one aspect the | lead timbre, see FAMILIES   |
|            | priority is vocal > bass > drums-words-skip > the rest of FAMILY_WORDS;  |                             |
|            | no instrument anywhere -> genre fallback (GENRE_FAMILY) -> "synth"       |                             |
| bass_line  | any bass word in an aspect that is not the lead's                         | root/fifth bass per beat    |
| tempo/bpm  | an explicit "... tempo" aspect decides (fast/uptempo 140, slow 70,       | 2 melody notes per beat;    |
|            | medium/moderate 100); otherwise FAST_WORDS vs SLOW_WORDS count, tie 100  | drum grid                   |
| mode       | MINOR_WORDS vs MAJOR_WORDS count; none -> "neutral"                      | scale + tonic (A3 natural   |
|            |                                                                          | minor / C4 major / D4 major |
|            |                                                                          | pentatonic)                 |
| noise      | NOISE_WORDS ("low quality", "noisy", "poor audio quality", "lo-fi", ...)  | 3 kHz low-pass + white      |
|            |                                                                          | noise at ~10 dB SNR + hum   |
| drums      | DRUM_WORDS (drums, percussion, beat, kick, snare, hi hat, ...)           | kick 1&3, snare 2&4, 8th    |
|            |                                                                          | hats                        |
| register   | HIGH_WORDS (female, high pitched, soprano, child, ...) -> high;          | octave shift +1 / -1 / 0    |
|            | LOW_WORDS (deep, low pitched, baritone, bass voice, ...) or lead bass -> |                             |
|            | low; else mid                                                            |                             |

Families (see `_partials`): piano (inharmonic 1/k^1.2 partials, 0.45-s decay), guitar (plucked comb
spectrum, 0.25-s decay), strings (sawtooth, slow attack, vibrato), synth (detuned square, gated),
organ (drawbar sines, flat), wind (near-sine + breath noise), brass (bright 1/k^0.6, swelling attack),
bass (low sine-ish, 0.6-s decay), vocal (glottal harmonics shaped by vowel formants, vibrato).

Per-clip randomness (melody walk, vowels, phases, drum noise) comes from sha256(ytid), never Python's
`hash()`; the whole corpus is byte-identical across runs.
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from tokenizer_pipeline.errors import USER_ERROR_EXIT, ConfigError, InputNotFoundError, UserError
from tokenizer_pipeline.standin_layouts import LAYOUTS, LayoutWriter

SAMPLE_RATE = 44_100  # Hz, what yt-dlp + ffmpeg typically give for YouTube audio
DURATION_S = 10.0  # MusicCaps windows are 10 s
LAYOUT_DURATION_S = 30.0  # --layout audiocraft|audiofolder: full-length tracks, cut into segments by the pipeline
NOTES_PER_BEAT = 2  # melody notes are 8ths: note rate = 2 * bpm / 60
PEAK = 0.891  # -1 dBFS after peak normalisation
SUBSET_CSV = "musiccaps-subset.csv"
CORPUS_JSON = "corpus.json"

# ---- keyword tables (lowercase; matched as whole words/phrases) ----
FAMILY_WORDS: dict[str, tuple[str, ...]] = {
    "vocal": (
        "vocal",
        "vocals",
        "voice",
        "voices",
        "singer",
        "singers",
        "singing",
        "vocalist",
        "vocalists",
        "choir",
        "rap",
        "rapping",
        "vocalisation",
        "vocalization",
        "humming",
        "chant",
        "chanting",
    ),
    "bass": ("bass", "e-bass", "bassline", "bass line", "upright bass", "double bass", "synth bass", "bass guitar"),
    "piano": ("piano", "keyboard", "keyboards", "keys", "harpsichord", "rhodes", "e-piano"),
    "guitar": (
        "guitar",
        "guitars",
        "e-guitar",
        "e-guitars",
        "banjo",
        "mandolin",
        "ukulele",
        "harp",
        "sitar",
        "stringed instrument",
    ),
    "strings": (
        "strings",
        "string",
        "violin",
        "violins",
        "cello",
        "cellos",
        "viola",
        "orchestra",
        "orchestral",
        "fiddle",
        "string section",
    ),
    "synth": (
        "synth",
        "synths",
        "synthesizer",
        "synthesiser",
        "synthesizers",
        "synthesiser arrangements",
        "electronic",
        "electro",
        "edm",
        "techno",
        "trance",
    ),
    "organ": ("organ", "accordion", "harmonium"),
    "wind": (
        "flute",
        "flutes",
        "wind instrument",
        "wind",
        "clarinet",
        "recorder",
        "oboe",
        "whistle",
        "didgeridoo",
        "bagpipes",
        "bansuri",
        "pan flute",
    ),
    "brass": (
        "brass",
        "trumpet",
        "trumpets",
        "sax",
        "saxophone",
        "horn",
        "horns",
        "trombone",
        "tuba",
        "brass section",
        "brass band",
    ),
}
# Bass words that are drums, not the bass instrument.
NOT_BASS = ("bass drum", "bass drums", "kick")
# Priority inside one aspect: "soft female vocal" -> vocal, "bass guitar" -> bass, "synth bass" -> bass.
FAMILY_PRIORITY = ("vocal", "bass", "piano", "strings", "brass", "wind", "organ", "guitar", "synth")
# Used only when no aspect names an instrument.
GENRE_FAMILY: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vocal", ("hip hop", "hip-hop", "r&b", "gospel", "a cappella", "opera", "soul")),
    ("synth", ("dance music", "club music", "dj", "house", "dubstep", "ambient")),
    ("guitar", ("rock", "metal", "punk", "country", "folk", "blues", "reggae")),
    ("strings", ("classical", "cinematic", "movie soundtrack", "soundtrack", "epic")),
    ("piano", ("jazz", "lullaby", "ballad")),
)
DEFAULT_FAMILY = "synth"
FAMILIES = ("piano", "guitar", "strings", "synth", "organ", "wind", "brass", "bass", "vocal")

FAST_WORDS = (
    "fast",
    "upbeat",
    "uptempo",
    "up-tempo",
    "energetic",
    "dance",
    "danceable",
    "edm",
    "techno",
    "trance",
    "club",
    "lively",
    "frantic",
    "high tempo",
    "quick",
)
SLOW_WORDS = (
    "slow",
    "mellow",
    "calm",
    "calming",
    "ballad",
    "relaxing",
    "relaxed",
    "lullaby",
    "soothing",
    "meditative",
    "ambient",
    "chill",
    "peaceful",
    "laid back",
    "gentle",
)
MINOR_WORDS = (
    "sad",
    "melancholic",
    "melancholy",
    "emotional",
    "dark",
    "minor",
    "sinister",
    "eerie",
    "haunting",
    "scary",
    "suspenseful",
    "mysterious",
    "sorrowful",
    "somber",
    "sombre",
    "gloomy",
    "horror",
    "depressing",
    "tragic",
    "ominous",
)
MAJOR_WORDS = (
    "happy",
    "joyful",
    "uplifting",
    "cheerful",
    "fun",
    "playful",
    "bright",
    "positive",
    "major",
    "buoyant",
    "happy mood",
    "optimistic",
    "jolly",
    "celebratory",
    "festive",
)
NOISE_WORDS = (
    "low quality",
    "noisy",
    "poor audio quality",
    "poor quality",
    "lo-fi",
    "lofi",
    "lo fi",
    "bad audio quality",
    "inferior audio quality",
    "low quality audio",
    "low quality recording",
    "amateur recording",
    "muffled",
    "distorted audio",
    "static",
    "hiss",
    "crackling",
)
DRUM_WORDS = (
    "drums",
    "drum",
    "drumming",
    "percussion",
    "percussions",
    "percussive",
    "beat",
    "beats",
    "kick",
    "snare",
    "hi hat",
    "hi hats",
    "hi-hat",
    "hi-hats",
    "hihat",
    "cymbal",
    "cymbals",
    "tabla",
    "tambourine",
    "claps",
    "clapping",
    "shaker",
    "shakers",
    "drum machine",
    "808",
    "bongo",
    "bongos",
    "conga",
    "congas",
)
HIGH_WORDS = (
    "female",
    "woman",
    "women",
    "girl",
    "soprano",
    "falsetto",
    "child",
    "children",
    "kid",
    "kids",
    "high pitched",
    "high-pitched",
    "high register",
    "high notes",
)
LOW_WORDS = (
    "deep",
    "low pitched",
    "low-pitched",
    "low register",
    "baritone",
    "bass voice",
    "bass vocal",
    "low notes",
    "sub bass",
    "sub-bass",
)

SCALES: dict[str, tuple[tuple[int, ...], int]] = {  # mode -> (semitone steps, tonic MIDI note)
    "major": ((0, 2, 4, 5, 7, 9, 11), 60),  # C4 major
    "minor": ((0, 2, 3, 5, 7, 8, 10), 57),  # A3 natural minor
    "neutral": ((0, 2, 4, 7, 9), 62),  # D4 major pentatonic
}
REGISTER_SHIFT = {"low": -12, "mid": 0, "high": 12}  # semitones
STANDIN_NOTE = (
    "Synthetic stand-in audio: MusicCaps publishes captions and YouTube ids but no audio, and this offline "
    "demo cannot download any. Each clip here is rendered by tokenizer_pipeline.standin_corpus from the "
    "row's aspect_list keywords (instrument family -> timbre, tempo words -> note rate, mood -> scale, "
    "quality words -> noise and band-limiting, percussion words -> a drum grid, register words -> octave) "
    "with a melody seeded from the ytid. The captions are real MusicCaps text; the audio is not the "
    "recording they describe, and nothing learned from it says anything about real music."
)


@dataclass(frozen=True)
class ClipAttributes:
    """What the renderer derived from one row's aspect_list."""

    family: str  # lead timbre, one of FAMILIES
    bass_line: bool  # extra bass part under the lead
    tempo: str  # fast | medium | slow
    bpm: float  # beats per minute
    mode: str  # major | minor | neutral
    tonic_midi: int  # MIDI note of the scale's tonic before the register shift
    register: str  # low | mid | high
    drums: bool  # kick/snare/hat grid
    noise: bool  # low-pass + added noise ("low quality" etc.)
    matched: dict[str, str]  # attribute -> the keyword that set it (for the docs / debugging)


def _has(text: str, phrase: str) -> bool:
    """Whole-word/phrase match ('bass' does not match 'bassoon'; 'low quality' is one phrase)."""
    return re.search(rf"(?<![a-z0-9]){re.escape(phrase)}(?![a-z0-9])", text) is not None


def _first(text: str, words: tuple[str, ...]) -> str | None:
    return next((w for w in words if _has(text, w)), None)


def _is_negated(aspect: str) -> bool:
    return aspect.startswith(("no ", "without ", "not ", "absence of "))


def _aspect_families(aspect: str) -> list[tuple[str, str]]:
    """(family, keyword) pairs named in one aspect, in FAMILY_PRIORITY order."""
    scrubbed = aspect
    for w in NOT_BASS:
        scrubbed = re.sub(rf"(?<![a-z0-9]){re.escape(w)}(?![a-z0-9])", " ", scrubbed)
    hits = []
    for fam in FAMILY_PRIORITY:
        kw = _first(scrubbed, FAMILY_WORDS[fam])
        if kw is not None:
            hits.append((fam, kw))
    return hits


def parse_aspects(aspect_list: str) -> list[str]:
    """The CSV's `aspect_list` column (a Python list literal) -> lowercase aspects."""
    value = ast.literal_eval(aspect_list)
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"aspect_list is not a list literal: {aspect_list[:80]!r}")
    return [str(a).strip().lower() for a in value]


def derive_attributes(aspects: list[str]) -> ClipAttributes:
    """Apply the keyword table (module docstring) to one row's aspects."""
    positive = [a for a in aspects if not _is_negated(a)]
    text = " | ".join(positive)
    matched: dict[str, str] = {}

    # family: first aspect naming an instrument; priority inside the aspect
    family = None
    named: set[str] = set()
    for a in positive:
        hits = _aspect_families(a)
        named.update(f for f, _ in hits)
        if hits and family is None:
            family, matched["family"] = hits[0]
    if family is None:
        for fam, words in GENRE_FAMILY:
            kw = _first(text, words)
            if kw is not None:
                family, matched["family"] = fam, f"genre:{kw}"
                break
    if family is None:
        family, matched["family"] = DEFAULT_FAMILY, "default"
    bass_line = family != "bass" and "bass" in named

    # tempo: explicit "... tempo" aspect first, then fast vs slow word counts
    tempo = None
    for a in positive:
        if "tempo" in a or _has(a, "uptempo"):
            if _first(a, ("fast", "uptempo", "up-tempo", "high", "quick")):
                tempo = "fast"
            elif _has(a, "slow"):
                tempo = "slow"
            elif _first(a, ("medium", "moderate", "mid", "mid-tempo")):
                tempo = "medium"
            if tempo is not None:
                matched["tempo"] = a
                break
    if tempo is None:
        n_fast = sum(_has(text, w) for w in FAST_WORDS)
        n_slow = sum(_has(text, w) for w in SLOW_WORDS)
        tempo = "fast" if n_fast > n_slow else "slow" if n_slow > n_fast else "medium"
        if tempo != "medium":
            matched["tempo"] = _first(text, FAST_WORDS if tempo == "fast" else SLOW_WORDS) or ""
    bpm = {"fast": 140.0, "medium": 100.0, "slow": 70.0}[tempo]

    # mode: minor vs major word counts
    n_minor = sum(_has(text, w) for w in MINOR_WORDS)
    n_major = sum(_has(text, w) for w in MAJOR_WORDS)
    mode = "minor" if n_minor > n_major else "major" if n_major > 0 else "neutral"
    if mode != "neutral":
        matched["mode"] = _first(text, MINOR_WORDS if mode == "minor" else MAJOR_WORDS) or ""

    noise_kw = _first(text, NOISE_WORDS)
    drum_kw = _first(text, DRUM_WORDS)
    high_kw, low_kw = _first(text, HIGH_WORDS), _first(text, LOW_WORDS)
    if high_kw is not None:
        register, matched["register"] = "high", high_kw
    elif low_kw is not None or family == "bass":
        register, matched["register"] = "low", low_kw or "family:bass"
    else:
        register = "mid"
    if noise_kw is not None:
        matched["noise"] = noise_kw
    if drum_kw is not None:
        matched["drums"] = drum_kw
    return ClipAttributes(
        family=family,
        bass_line=bass_line,
        tempo=tempo,
        bpm=bpm,
        mode=mode,
        tonic_midi=SCALES[mode][1],
        register=register,
        drums=drum_kw is not None,
        noise=noise_kw is not None,
        matched=matched,
    )


def clip_seed(ytid: str, seed: int = 0) -> int:
    """Stable 64-bit seed from the ytid (sha256; Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{ytid}".encode()).digest()[:8], "little")


# ---- synthesis ----
def _midi_hz(m: float) -> float:
    return 440.0 * 2.0 ** ((m - 69.0) / 12.0)


VOWELS = (  # (formant Hz, bandwidth Hz, gain) x 3: a, e, i, o, u
    ((730, 90, 1.0), (1090, 110, 0.5), (2440, 170, 0.25)),
    ((530, 60, 1.0), (1840, 100, 0.5), (2480, 120, 0.3)),
    ((270, 60, 1.0), (2290, 100, 0.35), (3010, 150, 0.25)),
    ((570, 80, 1.0), (840, 80, 0.6), (2410, 170, 0.15)),
    ((300, 60, 1.0), (870, 80, 0.4), (2240, 150, 0.1)),
)


def _partials(family: str, f0: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(freq ratio [H], amplitude [H], decay-rate multiplier [H]) of one note of `family`."""
    k = np.arange(1, 41, dtype=np.float64)  # [H]
    if family == "piano":
        k = k[:12]
        ratio, amp, decay = k * np.sqrt(1.0 + 4e-4 * k**2), k**-1.2, np.sqrt(k)
    elif family == "guitar":
        k = k[:14]
        ratio, amp, decay = k, np.abs(np.sin(np.pi * k * 0.18)) / k, k
    elif family == "strings":
        k = k[:18]
        ratio, amp, decay = k, 1.0 / k, np.zeros_like(k)
    elif family == "synth":
        k = k[0:23:2]  # odd harmonics: square wave
        ratio, amp, decay = k, 1.0 / k, np.zeros_like(k)
    elif family == "organ":
        k = np.array([1.0, 2.0, 3.0, 4.0, 6.0, 8.0])
        ratio, amp, decay = k, np.array([1.0, 0.8, 0.6, 0.5, 0.4, 0.3]), np.zeros_like(k)
    elif family == "wind":
        k = k[:3]
        ratio, amp, decay = k, np.array([1.0, 0.22, 0.07]), np.zeros_like(k)
    elif family == "brass":
        k = k[:16]
        ratio, amp, decay = k, k**-0.6, np.zeros_like(k)
    elif family == "bass":
        k = k[:5]
        ratio, amp, decay = k, np.array([1.0, 0.55, 0.3, 0.15, 0.08]), 0.5 * k
    elif family == "vocal":
        k = k[: max(1, int(4000.0 // f0))]
        formants = VOWELS[int(rng.integers(len(VOWELS)))]
        fk = k * f0
        env = sum(g / (1.0 + ((fk - fc) / bw) ** 2) for fc, bw, g in formants)
        ratio, amp, decay = k, env / k**0.5 + 0.01, np.zeros_like(k)
    else:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    keep = ratio * f0 < 0.45 * SAMPLE_RATE
    return ratio[keep], amp[keep], decay[keep]


# family -> (attack s, base decay time s or 0 = sustained, ring factor, vibrato depth, breath noise)
ENVELOPES: dict[str, tuple[float, float, float, float, float]] = {
    "piano": (0.004, 0.45, 2.0, 0.0, 0.0),
    "guitar": (0.002, 0.25, 2.0, 0.0, 0.0),
    "strings": (0.12, 0.0, 1.0, 0.006, 0.0),
    "synth": (0.01, 0.0, 0.8, 0.0, 0.0),
    "organ": (0.005, 0.0, 1.0, 0.0, 0.0),
    "wind": (0.06, 0.0, 1.0, 0.004, 0.08),
    "brass": (0.05, 0.0, 0.95, 0.003, 0.0),
    "bass": (0.005, 0.6, 1.5, 0.0, 0.0),
    "vocal": (0.05, 0.0, 1.0, 0.015, 0.0),
}


def _render_note(family: str, f0: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """One note, [n] float64 samples."""
    attack, tau, _, vib, breath = ENVELOPES[family]
    t = np.arange(n) / SAMPLE_RATE  # [n]
    if vib > 0.0:
        rate = 5.5
        phase = 2 * np.pi * f0 * t - f0 * vib * np.cos(2 * np.pi * rate * t) / rate  # [n] integral of f(t)
    else:
        phase = 2 * np.pi * f0 * t  # [n]
    ratio, amp, decay = _partials(family, f0, rng)  # [H] each
    offsets = rng.uniform(0.0, 2 * np.pi, size=len(ratio))  # [H]
    out = np.zeros(n)
    for r, a, d, o in zip(ratio, amp, decay, offsets):
        part = np.sin(r * phase + o)
        if family == "brass":  # higher partials come in later: the brass "blat"
            part *= 1.0 - np.exp(-t / (0.02 * np.sqrt(r)))
        if tau > 0.0 and d > 0.0:
            part *= np.exp(-t * d / tau)
        out += a * part
    if breath > 0.0:
        hiss = np.convolve(rng.standard_normal(n), np.ones(16) / 4.0, mode="same")  # [n], box low-pass ~2.7 kHz
        out += breath * np.sum(amp) * hiss
    env = np.minimum(1.0, t / attack)  # [n] linear attack
    rel = min(n, int(0.03 * SAMPLE_RATE))
    env[n - rel :] *= np.linspace(1.0, 0.0, rel)  # 30-ms release, no clicks
    return out * env


def _place(buf: np.ndarray, note: np.ndarray, start: int) -> None:
    end = min(len(buf), start + len(note))
    buf[start:end] += note[: end - start]


def _peak_norm(x: np.ndarray, peak: float = 1.0) -> np.ndarray:
    m = float(np.max(np.abs(x)))
    return x * (peak / m) if m > 0 else x


def _drums(bpm: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Kick on beats 1 & 3, snare on 2 & 4, closed hat on every 8th. [n]"""
    out = np.zeros(n)
    beat = 60.0 / bpm
    tk = np.arange(int(0.25 * SAMPLE_RATE)) / SAMPLE_RATE
    kick = np.sin(2 * np.pi * (50 * tk + 100 * 0.03 * (1 - np.exp(-tk / 0.03)))) * np.exp(-tk / 0.12)
    ts = np.arange(int(0.2 * SAMPLE_RATE)) / SAMPLE_RATE
    th = np.arange(int(0.06 * SAMPLE_RATE)) / SAMPLE_RATE
    n_beats = int(n / SAMPLE_RATE / beat) + 1
    for b in range(n_beats):
        start = int(round(b * beat * SAMPLE_RATE))
        if b % 2 == 0:
            _place(out, kick, start)
        else:
            snare = (0.7 * rng.standard_normal(len(ts)) + 0.5 * np.sin(2 * np.pi * 185 * ts)) * np.exp(-ts / 0.07)
            _place(out, 0.8 * snare, start)
        for half in (0, 1):
            hat = np.diff(rng.standard_normal(len(th) + 1)) * np.exp(-th / 0.015)  # high-passed noise
            _place(out, 0.25 * hat, int(round((b + 0.5 * half) * beat * SAMPLE_RATE)))
    return out


def _lowpass(x: np.ndarray, cutoff_hz: float) -> np.ndarray:
    """Zero-phase FFT low-pass with a 500-Hz cosine taper."""
    spec = np.fft.rfft(x)  # [n//2+1]
    f = np.fft.rfftfreq(len(x), 1.0 / SAMPLE_RATE)
    gain = np.clip((cutoff_hz + 500.0 - f) / 500.0, 0.0, 1.0)
    gain = 0.5 - 0.5 * np.cos(np.pi * gain)
    return np.fft.irfft(spec * gain, n=len(x))


def render_clip(attrs: ClipAttributes, ytid: str, seed: int = 0, duration_s: float = DURATION_S) -> np.ndarray:
    """Render one clip. Returns [duration_s * SAMPLE_RATE] float64 in [-PEAK, PEAK]."""
    rng = np.random.default_rng(clip_seed(ytid, seed))
    n = int(round(duration_s * SAMPLE_RATE))
    steps, tonic = SCALES[attrs.mode]
    base = tonic + REGISTER_SHIFT[attrs.register] + (-24 if attrs.family == "bass" else 0)
    note_s = 60.0 / attrs.bpm / NOTES_PER_BEAT
    ring = ENVELOPES[attrs.family][2]

    # melody: bounded random walk over two octaves of scale degrees
    lead = np.zeros(n)
    n_notes = int(np.ceil(duration_s / note_s))
    degree = int(rng.integers(0, len(steps)))
    for i in range(n_notes):
        degree = int(np.clip(degree + rng.choice([-2, -1, -1, 0, 1, 1, 2]), 0, 2 * len(steps) - 1))
        midi = base + 12 * (degree // len(steps)) + steps[degree % len(steps)]
        start = int(round(i * note_s * SAMPLE_RATE))
        _place(lead, _render_note(attrs.family, _midi_hz(midi), int(ring * note_s * SAMPLE_RATE), rng), start)
    mix = _peak_norm(lead)

    if attrs.bass_line:  # tonic, tonic, fifth, fourth: one note per beat, two octaves down
        bass = np.zeros(n)
        beat = 60.0 / attrs.bpm
        pattern = (0, 0, 4 if len(steps) == 7 else 3, 3 if len(steps) == 7 else 2)
        for b in range(int(np.ceil(duration_s / beat))):
            midi = tonic - 24 + steps[pattern[b % 4]]
            note = _render_note("bass", _midi_hz(midi), int(1.2 * beat * SAMPLE_RATE), rng)
            _place(bass, note, int(round(b * beat * SAMPLE_RATE)))
        mix = mix + 0.6 * _peak_norm(bass)
    if attrs.drums:
        mix = mix + 0.7 * _peak_norm(_drums(attrs.bpm, n, rng))
    mix = _peak_norm(mix)
    if attrs.noise:  # lo-fi: band-limited, hissy, humming
        t = np.arange(n) / SAMPLE_RATE
        mix = _lowpass(mix, 3000.0)
        rms = float(np.sqrt(np.mean(mix**2)))
        mix = mix + 0.3 * rms * rng.standard_normal(n) + 0.1 * rms * np.sin(2 * np.pi * 60.0 * t)
    return _peak_norm(mix, PEAK)


def to_pcm16(x: np.ndarray) -> np.ndarray:
    """float in [-1, 1] -> int16, rounding (not truncating) so bytes are stable."""
    return np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int16)


# ---- subset selection + CLI ----
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


def select_rows(rows: list[dict[str, str]], n_clips: int, eval_fraction: float, seed: int) -> list[int]:
    """Indices (CSV order) of n_clips rows: round(n*eval_fraction) eval rows, the rest train, by seeded hash."""
    if n_clips < 1:
        raise ConfigError(f"--n-clips must be >= 1, got {n_clips}")
    if not 0.0 <= eval_fraction <= 1.0:
        raise ConfigError(f"--eval-fraction must be in [0, 1], got {eval_fraction}")
    n_eval = int(round(n_clips * eval_fraction))
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
    layout: str = "musiccaps", sample_rate: int = SAMPLE_RATE, channels: int = 1,
) -> dict:  # fmt: skip
    """Select rows, render and write every clip, the subset CSV and corpus.json. Returns the corpus.json dict.

    `layout` other than musiccaps writes the clips as full-length tracks in that layout (standin_layouts.py).
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
    clips = []
    for i in idx:
        row = rows[i]
        ytid = row["ytid"]
        if not re.fullmatch(r"[A-Za-z0-9_-]+", ytid):
            raise ConfigError(f"{csv_path}:{lines[i]}: ytid {ytid!r} is not a YouTube id; cannot name {ytid}.wav")
        attrs = derive_attributes(parse_aspects(row["aspect_list"]))
        audio = render_clip(attrs, ytid, seed, duration_s)  # [duration_s * SAMPLE_RATE]
        split = "eval" if row["is_audioset_eval"] == "True" else "train"
        if layout_writer is not None:
            aspects = parse_aspects(row["aspect_list"])
            file = layout_writer.add(row, aspects, asdict(attrs), audio, SAMPLE_RATE, split)
        else:
            tmp = out / f".{ytid}.wav.tmp"
            sf.write(str(tmp), to_pcm16(audio), SAMPLE_RATE, subtype="PCM_16", format="WAV")
            tmp.replace(out / f"{ytid}.wav")
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenizer_pipeline.standin_corpus", description=__doc__.split("\n")[0])
    p.add_argument("--csv", type=Path, required=True, help="MusicCaps CSV (data/musiccaps/musiccaps-public.csv)")
    p.add_argument("--out", type=Path, required=True, help="output directory (wavs, subset CSV, corpus.json)")
    p.add_argument(
        "--n-clips",
        type=int,
        default=320,
        help="rows to render; more = slower encode, but the demo's caption check needs the variety",
    )
    p.add_argument("--eval-fraction", type=float, default=0.25, help="share of rows with is_audioset_eval=True")
    p.add_argument("--seed", type=int, default=0, help="row selection and per-clip randomness")
    p.add_argument(
        "--duration-s", type=float, default=None, help="clip length; default 10 s (MusicCaps), 30 s for other layouts"
    )
    p.add_argument(
        "--layout", choices=LAYOUTS, default="musiccaps",
        help="musiccaps: {ytid}.wav + subset CSV; audiocraft: data.jsonl + sidecars; audiofolder: train/ test/ + metadata.csv",
    )  # fmt: skip
    p.add_argument("--sample-rate", type=int, default=SAMPLE_RATE, help="tracks' rate (audiocraft/audiofolder)")
    p.add_argument("--channels", type=int, default=None, help="1 or 2; default 1 (musiccaps), 2 for other layouts")
    args = p.parse_args(argv)
    full = args.layout != "musiccaps"
    duration = args.duration_s if args.duration_s is not None else (LAYOUT_DURATION_S if full else DURATION_S)
    channels = args.channels if args.channels is not None else (2 if full else 1)
    t0 = time.perf_counter()
    try:
        corpus = build_corpus(
            args.csv, args.out, args.n_clips, args.eval_fraction, args.seed, duration, args.layout, args.sample_rate,
            channels,
        )  # fmt: skip
    except UserError as e:  # a missing CSV or a value that cannot work: the message names the fix
        print(f"tokenizer_pipeline.standin_corpus: error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    fams: dict[str, int] = {}
    for c in corpus["clips"]:
        fams[c["family"]] = fams.get(c["family"], 0) + 1
    print(
        f"stand-in corpus: {corpus['n_clips']} clips ({corpus['n_train']} train, {corpus['n_eval']} eval) "
        f"-> {args.out} in {time.perf_counter() - t0:.1f} s; families {dict(sorted(fams.items()))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

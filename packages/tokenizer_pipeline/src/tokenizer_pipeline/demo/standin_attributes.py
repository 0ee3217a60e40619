"""The stand-in corpus's caption -> attributes step: a row's `aspect_list` keywords -> `ClipAttributes`.

Aspects are matched lowercase as whole words/phrases (word lists in `standin_keywords`); one starting with "no " or
"without " is a negation and switches nothing on.
- family (lead timbre): the first aspect naming an instrument (inside one: vocal > bass > the rest), else the genre's
  (GENRE_FAMILY), else "synth"; bass_line: a bass word in an aspect that is not the lead's.
- tempo: an explicit "... tempo" aspect (fast 140, slow 70, medium 100 bpm), else FAST_WORDS vs SLOW_WORDS, tie 100.
- mode: MINOR_WORDS vs MAJOR_WORDS (A3 minor / C4 major / D4 pentatonic when neutral).
- noise (low-pass + white noise + hum), drums (kick 1&3, snare 2&4, 8th hats): NOISE_WORDS, DRUM_WORDS.
- register: HIGH_WORDS high, LOW_WORDS (or a bass lead) low, else mid (octave +1 / -1 / 0).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .standin_keywords import (
    DEFAULT_FAMILY,
    DRUM_WORDS,
    FAMILY_PRIORITY,
    FAMILY_WORDS,
    FAST_WORDS,
    GENRE_FAMILY,
    HIGH_WORDS,
    LOW_WORDS,
    MAJOR_WORDS,
    MINOR_WORDS,
    NOISE_WORDS,
    NOT_BASS,
    SLOW_WORDS,
)

SCALES: dict[str, tuple[tuple[int, ...], int]] = {  # mode -> (semitone steps, tonic MIDI note)
    "major": ((0, 2, 4, 5, 7, 9, 11), 60),  # C4 major
    "minor": ((0, 2, 3, 5, 7, 8, 10), 57),  # A3 natural minor
    "neutral": ((0, 2, 4, 7, 9), 62),  # D4 major pentatonic
}


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

"""Captions from track metadata, as audiocraft reads it (audiocraft/data/music_dataset.py, info_audio_dataset.py).

Field values are normalised as `MusicInfo.attribute_getter` does; empty strings, "None" and "nan" count as missing.
`caption="field"`: the `caption_column` field (audiofolder: falls back to `text`). `caption="template"`: each
`{field}` owns the literal label just before it, and a missing field drops both. No caption at all is None (the run
records a `no_caption` failure, never an empty caption).
"""

from __future__ import annotations

import ast
import math
import re
import string
from typing import Any

from ..errors import ConfigError

KEYWORD_FIELDS = ("genre", "instrument", "name")
KEYWORD_LIST_FIELDS = ("moods", "keywords")
STRING_FIELDS = ("title", "artist", "description")
CAPTION_MODES = ("field", "template")
LEADING_SEPARATORS = " \t\n.,;:-"
MISSING_TEXT = ("None", "nan", "NaN", "NAN")  # audiocraft's "None"; pandas' str(float("nan")) and its NaN cell


def _string(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip() or value.strip() in MISSING_TEXT:
        return None
    return value.strip()


def _keyword(value: Any) -> str | None:
    s = _string(value)
    return None if s is None else s.lower()


def _keyword_list(value: Any) -> list[str] | None:
    if isinstance(value, str):
        value = re.split(r"[,\s]", value)
    elif isinstance(value, float) and math.isnan(value):
        value = []
    elif not isinstance(value, list):
        value = [] if value is None else [str(value)]
    kws = [k for k in (_keyword(v) for v in value) if k is not None]
    return kws or None


def _bpm(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        bpm = float(value)
    except (TypeError, ValueError):
        return None
    return bpm if math.isfinite(bpm) else None


def _musical_key(value: Any) -> str | None:
    s = _string(value)
    return None if s is None or "," in s else s.lower()


def normalised(name: str, value: Any) -> Any:
    """The field's value as audiocraft reads it (None when missing or empty)."""
    if name == "bpm":
        return _bpm(value)
    if name == "key":
        return _musical_key(value)
    if name in KEYWORD_LIST_FIELDS:
        return _keyword_list(value)
    if name in KEYWORD_FIELDS:
        return _keyword(value)
    if name in STRING_FIELDS or isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return [str(v) for v in value if str(v).strip()] or None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def as_text(value: Any) -> str | None:
    """A normalised value as caption text: lists joined with ", ", 120.0 -> "120"."""
    if value is None:
        return None
    if isinstance(value, list):
        return ", ".join(value) or None
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value).strip()
    return text or None


def check_template(template: str) -> list[str]:
    """The template's field names; ConfigError when it does not parse or has none."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise ConfigError(f"source.template={template!r} does not parse ({e}); write fields as {{description}}") from e
    if not names or any(not n.isidentifier() for n in names):
        raise ConfigError(
            f"source.template={template!r} must name metadata fields as {{field}}, e.g. "
            "'{description} genre: {genre}. bpm: {bpm}'"
        )
    return names


def fill_template(template: str, metadata: dict[str, Any]) -> str | None:
    """The template with each field's normalised value; missing fields are dropped with their label text."""
    parts: list[str] = []
    pending = ""  # literal text since the previous field ('{{' / '}}' split it into several chunks)
    for literal, name, _, _ in string.Formatter().parse(template):
        if name is None:
            pending += literal
            continue
        text = as_text(normalised(name, metadata.get(name)))
        if text is not None:
            parts.append(pending + literal + text)
        pending = ""
    if not parts:
        return None
    caption = ("".join(parts) + pending).lstrip(LEADING_SEPARATORS).strip()
    return caption or None


def caption_of(metadata: dict[str, Any], mode: str, column: str, template: str, fallback: str | None) -> str | None:
    """The track's caption, or None when it has none."""
    if mode == "template":
        return fill_template(template, metadata)
    text = as_text(normalised(column, metadata.get(column)))
    if text is None and fallback is not None and column not in metadata:
        text = as_text(normalised(fallback, metadata.get(fallback)))
    return text


def _phrases(value: Any) -> Any:
    """A free-form keyword column (e.g. audiofolder's aspect_list): "a, b" or "['a', 'b']" -> ["a", "b"]."""
    if not isinstance(value, str):
        return value
    if value.strip().startswith("["):
        try:
            parsed = ast.literal_eval(value.strip())  # a list literal, as MusicCaps writes aspect_list; never eval()
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            parsed = None
        if isinstance(parsed, list):
            return [str(v) for v in parsed]
    return [v for v in (p.strip() for p in value.split(",")) if v]


def aspects_of(metadata: dict[str, Any], fields: list[str]) -> list[str]:
    """Keywords of the `fields` (lists flattened), in field order, each once. audiocraft's fields follow its rules
    (keywords/moods split on commas and spaces); any other field is split on commas (or read as a list literal)."""
    out: list[str] = []
    for name in fields:
        raw = metadata.get(name)
        known = name in KEYWORD_FIELDS + KEYWORD_LIST_FIELDS + STRING_FIELDS + ("bpm", "key")
        value = normalised(name, raw if known else _phrases(raw))
        for v in value if isinstance(value, list) else ([] if value is None else [as_text(value)]):
            if v and v not in out:
                out.append(v)
    return out


def check_caption_mode(mode: str, template: str) -> None:
    if mode not in CAPTION_MODES:
        raise ConfigError(f"source.caption={mode!r} is not one of {CAPTION_MODES}")
    if mode == "template":
        check_template(template)

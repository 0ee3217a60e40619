"""The command line's overrides, checked before Hydra composes anything: a key the schema does not declare is refused
in one line with the key it most likely meant.

Hydra alone would answer `limt=5` with "use +limt=5" and then run `+limt=5` over every row (a `+` adds any key to
the composed config). Here both are refused, with `limit` as the likely fix, before the CSV, the audio or the codec
is read. What stays: group choices (`source=audiocraft`, `+preset=demo`), `hydra.*` and `hydra/...`, and every key
the schema's dataclasses declare (the presets only set those). adapter_trainer/overrides.py does the same for stage 2
(the packages share no code).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .errors import UserError


class OverrideError(UserError, ValueError):
    """An override names a key the config does not have (or adds one it has); the message names the fix."""


def declared_keys(schema: type) -> tuple[set[str], set[str], set[str]]:
    """(every dotted key of a value in the dataclass schema, the keys whose value is open: dicts, lists and Any,
    whose own sub-keys are not declared, and the sections: `trainer`, `data.cache`, ...)."""
    keys: set[str] = set()
    open_keys: set[str] = set()
    sections: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key, t = f"{prefix}{f.name}", hints[f.name]
            keys.add(key)
            union = typing.get_origin(t) in (typing.Union, types.UnionType)
            inner = [a for a in typing.get_args(t) if a is not type(None)] if union else [t]  # Optional[X] -> X
            if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
                sections.add(key)
                walk(inner[0], f"{key}.")
            elif any(a is Any or typing.get_origin(a) in (dict, list) or a in (dict, list) for a in inner):
                open_keys.add(key)

    walk(schema, "")
    return keys - sections, open_keys, sections


def open_mappings(schema: type) -> set[str]:
    """The dotted keys whose value is a dict (`yt_dlp_params`): Hydra adds a key to one only with a `+`."""
    found: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key, t = f"{prefix}{f.name}", hints[f.name]
            inner = [a for a in typing.get_args(t) if a is not type(None)] or [t]
            if dataclasses.is_dataclass(t):
                walk(t, f"{key}.")
            elif any(a is dict or typing.get_origin(a) is dict for a in (t, *inner)):
                found.add(key)

    walk(schema, "")
    return found


def config_groups(conf_dirs: Iterable[Path]) -> set[str]:
    """Hydra config groups (`experiment`, `model`, ...): the sub-folders of the config directories."""
    return {p.relative_to(d).as_posix() for d in conf_dirs if d.is_dir() for p in d.rglob("*") if p.is_dir()}


def default_groups(primary: Path) -> set[str]:
    """Groups the primary config's defaults list already chooses (`data: musiccaps`): set without a `+`."""
    from omegaconf import OmegaConf

    names = set()
    for entry in OmegaConf.to_container(OmegaConf.load(primary)).get("defaults", []):  # type: ignore[union-attr]
        if isinstance(entry, dict):
            names.update(str(k).removeprefix("override ").strip() for k in entry)
    return names


def _quoted(value: object) -> str:
    """A path as a quoted Hydra string (its commas, brackets and spaces stay part of it)."""
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def _as_list(override: Any, multirun: bool) -> str | None:
    """`data.shards=DIR` -> `data.shards=[DIR]`; an unquoted `a,b` (Hydra's sweep syntax) -> `[a,b]` in a run,
    `[a],[b]` (a sweep over single sets) under --multirun. None: already a list (or another sweep), keep it."""
    from hydra.core.override_parser.types import ChoiceSweep

    head, _, text = override.input_line.partition("=")
    value = override.value()
    if isinstance(value, ChoiceSweep):
        if not multirun:
            return f"{head}=[{text}]"
        return f"{head}=" + ",".join(f"[{_quoted(v)}]" if isinstance(v, str) else f"[{v}]" for v in value.list)
    if value == "":
        return f"{head}=[]"  # refused next as an empty list, naming the fix
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return f"{head}=[{_quoted(value)}]"
    if isinstance(value, dict):
        return f"{head}=[{text}]"
    return None


def _suggest(key: str, candidates: set[str]) -> str | None:
    """The declared key `key` most likely meant: the closest dotted key, else the closest by its last part."""
    close = difflib.get_close_matches(key, sorted(candidates), n=1, cutoff=0.75)
    if close:
        return close[0]
    by_leaf: dict[str, str] = {}
    for c in sorted(candidates, key=len):
        by_leaf.setdefault(c.rsplit(".", 1)[-1], c)
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], sorted(by_leaf), n=1, cutoff=0.75)
    return by_leaf[close[0]] if close else None


def check_overrides(
    argv: list[str],
    *,
    schema: type,
    conf_dir: Path,
    primary: str,
    keys_hint: str,
    list_keys: Iterable[str] = (),
    groups_apply: bool = True,
) -> list[str]:
    """The command line `argv` (without the program), with each of `list_keys` given as one value or a comma list
    made a list; raises OverrideError for a key the schema does not declare (or a `+` on one it does, or a group
    chosen without the + it needs), naming the likely fix. `primary`: the config's name (its defaults list);
    `keys_hint`: where every key is listed. Overrides Hydra cannot parse are left to Hydra, which refuses them with
    its own message."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    args, rest = get_args_parser().parse_known_args(argv)
    given = [*args.overrides, *(a for a in rest if "=" in a and not a.startswith("-"))]
    try:
        parsed = OverridesParser.create().parse_overrides(given)
    except OverrideParseException:
        return argv  # Hydra parses the same overrides next and refuses them with its own message
    conf_dirs = [conf_dir, *([Path(args.config_dir)] if args.config_dir else [])]
    groups = config_groups(conf_dirs) if groups_apply else set()  # download's config chooses no group
    name = f"{args.config_name or primary}.yaml"
    primary_file = next((d / name for d in conf_dirs if (d / name).is_file()), None)
    in_defaults = default_groups(primary_file) if primary_file is not None else set()
    keys, open_keys, sections = declared_keys(schema)
    mappings = open_mappings(schema)
    multirun = args.multirun or any(o.input_line.replace(" ", "") == "hydra.mode=MULTIRUN" for o in parsed)
    rewritten = {}
    for o in parsed:
        key = o.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")) or o.package is not None:
            continue
        if key in groups:
            if key not in in_defaults and not (o.is_add() or o.is_force_add() or o.is_delete()):
                raise OverrideError(f"{o.input_line}: {key} is an optional config group; add a +: +{o.input_line}")
            if key in in_defaults and o.is_add():
                fixed = o.input_line.removeprefix("+")
                raise OverrideError(f"{o.input_line}: the config chooses a {key} already; drop the +: {fixed}")
            continue
        mapping = next((m for m in mappings if key == m or key.startswith(f"{m}.")), None)
        if mapping is not None:  # every key of it is the user's: Hydra adds one only with a + (or ++)
            if not (o.is_add() or o.is_force_add() or o.is_delete()):
                raise OverrideError(f"{o.input_line}: {mapping} takes keys of your own; add a +: +{o.input_line}")
            continue
        if key in keys or key in sections:
            if o.is_add():
                fixed = o.input_line.removeprefix("+")
                raise OverrideError(f"{o.input_line}: {key} is a config key already; drop the +: {fixed}")
            if key in list_keys and not o.is_delete():
                line = _as_list(o, multirun)
                if line is not None:
                    rewritten[o.input_line] = line
            continue
        if any(key.startswith(f"{k}.") or key.startswith(f"{k}[") for k in open_keys):
            continue
        candidates = keys if "." in key else keys | {f"+{g}" for g in groups - in_defaults} | in_defaults
        guess = _suggest(key, candidates)
        value = o.input_line.partition("=")[2]
        hint = f" (did you mean {guess}={value}?)" if guess and not o.is_delete() else f" (did you mean {guess}?)"
        raise OverrideError(
            f"{o.input_line}: {key} is not a config key{hint if guess else ''}; every key and its default: {keys_hint}"
        )
    return [rewritten.get(a, a) for a in argv]

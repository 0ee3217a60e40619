"""The Hydra plumbing both packages' commands share: where this package's configs live, and a command line's
refusals in one line naming the key most likely meant.

Configs: $<PACKAGE>_CONF_DIR, the repository's `conf/<package>`, then the copy a normal wheel carries; Hydra's
`--config-dir` adds a directory on top. Hydra refuses `key=value` for an undeclared key itself, while `+key=value`
adds the key to the composed config: `refusals_in_one_line` turns Hydra's refusal into `<prog>: error: <one line>`,
`undeclared_line` names a key the composed config holds beyond its schema. adapter_trainer holds an identical copy.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shlex
import sys
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PACKAGE = __name__.split(".")[0]
ENV = f"{PACKAGE.upper()}_CONF_DIR"


def find_conf_dir() -> Path:
    """Absolute path of the config directory; raises FileNotFoundError naming every place looked at."""
    here = Path(__file__).resolve().parent
    candidates = [Path(os.environ[ENV]).expanduser().resolve()] if os.environ.get(ENV) else []
    candidates += [here.parents[3] / "conf" / PACKAGE, here / "conf"]
    for c in candidates:
        if c.is_dir():
            return c
    raise FileNotFoundError(
        f"no config directory for {PACKAGE}; looked at {', '.join(map(str, candidates))}. "
        f"Set {ENV}=/path/to/conf/{PACKAGE} or pass --config-dir."
    )


# what Hydra's override grammar reads as a plain value (its ID and unquoted characters, less $ \\ * ? |); else quoted
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_/+.%@:-]+")
# plain values Hydra reads as another type (a number, true/false, null, inf/nan): quoted to stay strings
_TYPED = re.compile(r"[-+]?[\d_.]*([eE][-+]?\d+)?|(?i:true|false|null|[-+]?inf|nan)")
_SHELL_SAFE_IN_DOUBLE = re.compile(r'[^"$`\\!]*')  # nothing bash or zsh expands inside double quotes


def hydra_value(value: str) -> str:
    """`value` (one string) as Hydra's grammar reads it back: as is when plain, else in single quotes (a space, a
    non-ASCII letter, `~`, brackets). `key=` + this is one override."""
    if _PLAIN_VALUE.fullmatch(value) and not _TYPED.fullmatch(value):
        return value
    # in a quoted value a quote is escaped, and so is every backslash right before a quote or the end; `${` would be
    # an interpolation (OmegaConf resolves it in quotes too): `\${` keeps it literal
    escaped = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return "'" + escaped.replace("${", "\\${") + "'"


def shell_word(arg: str) -> str:
    """`arg` quoted so that pasting it into bash or zsh gives it back: as is, in single quotes, or (holding a single
    quote, such as Hydra's quoted value) in double quotes when nothing in it expands there."""
    quoted = shlex.quote(arg)
    if quoted == arg or "'" not in arg:
        return quoted
    return f'"{arg}"' if _SHELL_SAFE_IN_DOUBLE.fullmatch(arg) else quoted


def override_word(key: str, value: str) -> str:
    """`key=value` as one word to paste into bash or zsh, read back by Hydra as that key and value."""
    return shell_word(f"{key}={hydra_value(value)}")


def declared_keys(schema: type) -> tuple[set[str], set[str]]:
    """(every dotted key of the dataclass schema, sections included: `trainer`, `data.cache`, ...; the keys whose value
    is open, lists, dicts and Any, whose own sub-keys are not declared)."""
    keys: set[str] = set()
    open_keys: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key, t = f"{prefix}{f.name}", hints[f.name]
            keys.add(key)
            union = typing.get_origin(t) in (typing.Union, types.UnionType)
            inner = [a for a in typing.get_args(t) if a is not type(None)] if union else [t]  # Optional[X] -> X
            if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
                walk(inner[0], f"{key}.")
            elif any(a is Any or typing.get_origin(a) in (dict, list) or a in (dict, list) for a in inner):
                open_keys.add(key)

    walk(schema, "")
    return keys, open_keys


def config_groups(conf_dir: Path) -> set[str]:
    """Hydra config groups (`experiment`, `model`, ...): the sub-folders of the config directory."""
    return {p.relative_to(conf_dir).as_posix() for p in conf_dir.rglob("*") if p.is_dir()}


def default_groups(primary: Path) -> set[str]:
    """The groups the primary config's defaults list chooses (`data: musiccaps`): chosen without a `+`."""
    from omegaconf import OmegaConf

    entries = OmegaConf.to_container(OmegaConf.load(primary)).get("defaults", [])  # type: ignore[union-attr]
    return {str(k).removeprefix("override ").strip() for e in entries if isinstance(e, dict) for k in e}


def suggest(key: str, candidates: set[str]) -> str | None:
    """The candidate `key` most likely meant: the closest dotted key, else the closest by its last part."""
    close = difflib.get_close_matches(key, sorted(candidates), n=1, cutoff=0.75)
    if close:
        return close[0]
    by_leaf: dict[str, str] = {}
    for c in sorted(candidates, key=len):
        by_leaf.setdefault(c.rsplit(".", 1)[-1], c)
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], sorted(by_leaf), n=1, cutoff=0.75)
    return by_leaf[close[0]] if close else None


def _overrides(argv: list[str]) -> Iterator[tuple[str, str, str, str]]:
    """(the override as typed, its prefix `+`/`++`/`~`, key, value) of each `key=value` on the command line; Hydra's
    own settings (`hydra.*`, `hydra/...`) and options are left out."""
    for arg in argv:
        head, sep, value = arg.partition("=")
        key = head.lstrip("+~")
        if sep and not arg.startswith("-") and "@" not in key and key != "hydra" and not key.startswith("hydra"):
            yield arg, head[: len(head) - len(key)], key, value


def _unknown(arg: str, key: str, value: str, candidates: set[str], keys_hint: str) -> str:
    sections = {c.rsplit(".", 1)[0] for c in candidates if "." in c}  # `trainer` is no key to set to a value
    guess = suggest(key, candidates - sections)
    hint = f" (did you mean {guess}={value}?)" if guess and value else f" (did you mean {guess}?)" if guess else ""
    return f"{arg}: {key} is not a config key{hint}; every key and its default: {keys_hint}"


def undeclared_line(cfg: dict[str, Any], schema: type, argv: list[str], groups: set[str], keys_hint: str) -> str | None:
    """One line for the first key of the composed config `cfg` (a plain container) that `schema` does not declare (one
    a `+` added), naming the likely key; None when every key is declared. `argv`: the command line (the key's
    override as typed); `groups`: the config groups (`+experiment` is a candidate for a top-level key)."""
    keys, open_keys = declared_keys(schema)

    def first(node: dict[str, Any], prefix: str) -> str | None:
        for name, value in node.items():
            key = f"{prefix}{name}"
            if key not in keys:
                return key
            if isinstance(value, dict) and key not in open_keys and (found := first(value, f"{key}.")):
                return found
        return None

    key = first(cfg, "")
    if key is None:
        return None
    arg, value = next(((a, v) for a, _, k, v in _overrides(argv) if k == key), (key, ""))
    return _unknown(arg, key, value, keys | {f"+{g}" for g in groups} if "." not in key else keys, keys_hint)


def refusal_line(
    argv: list[str],
    schema: type,
    groups: set[str],
    in_defaults: set[str],
    keys_hint: str,
    options: dict[str, set[str]] | None = None,
) -> str | None:
    """Hydra refused the command line `argv`: one line for the first override that Hydra cannot parse (naming its
    quoted form), names an undeclared key, adds (+) a declared one, chooses a config group without the + it needs or
    with one it must not have or an option the group lacks (`options`: group -> its options), or gives a value of
    the wrong type; None when no override is at fault (Hydra's own message stands). `in_defaults`: the groups the
    primary config chooses already."""
    keys, open_keys = declared_keys(schema)
    for arg, prefix, key, value in _overrides(argv):
        if (line := _unparsable(arg, prefix, key, value)) is not None:
            return line
        if key in groups:
            if key not in in_defaults and not prefix:
                return f"{arg}: {key} is an optional config group; add a +: +{arg}"
            if key in in_defaults and prefix == "+":
                return f"{arg}: the config chooses a {key} already; drop the +: {arg[1:]}"
            known = (options or {}).get(key)
            if known and value not in known:
                guess = difflib.get_close_matches(value, sorted(known), n=1, cutoff=0.6)
                hint = f" (did you mean {prefix}{key}={guess[0]}?)" if guess else ""
                return f"{arg}: {key} has no option {value!r}{hint}; its options: {', '.join(sorted(known))}"
        elif key in keys:
            if prefix == "+":
                return f"{arg}: {key} is a config key already; drop the +: {arg[1:]}"
            if (line := _wrong_type(arg, key, value, schema)) is not None:
                return line
        elif opened := next((k for k in sorted(open_keys) if key.startswith((f"{k}.", f"{k}["))), None):
            if not prefix:  # a key of the user's own inside an open mapping: Hydra adds it only with a +
                return f"{arg}: {opened} takes keys of your own; add a +: +{arg}"
        else:
            candidates = keys if "." in key else keys | {f"+{g}" for g in groups - in_defaults}
            return _unknown(arg, key, value, candidates, keys_hint)
    return None


def _unparsable(arg: str, prefix: str, key: str, value: str) -> str | None:
    """One line for an override Hydra's grammar cannot read (a path with a space, a non-ASCII letter or `~`): its
    quoted form to paste; None when Hydra reads it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        OverridesParser.create().parse_override(arg)
        return None
    except HydraException:
        pass
    if value.startswith("[") and value.endswith("]"):  # a list as typed: each element quoted
        quoted = "[" + ",".join(hydra_value(v.strip()) for v in value[1:-1].split(",") if v.strip()) + "]"
    else:
        quoted = hydra_value(value)
    fixed = f"{prefix}{key}={quoted}"
    try:
        OverridesParser.create().parse_override(fixed)
    except HydraException:
        return None  # not a quoting problem: Hydra's own message says what it is
    return (
        f"{arg}: Hydra reads a value with a space, `~` or characters other than letters, digits and _/+.-%@: only "
        f"in quotes; type it as {shell_word(fixed)}"
    )


def _field_type(schema: type, key: str) -> type | None:
    """The declared type of the dotted `key` (Optional[X] -> X), or None when it is not a plain field."""
    cls: Any = schema
    t: Any = None
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            return None
        t = typing.get_type_hints(cls).get(part)
        if t is None:
            return None
        if typing.get_origin(t) in (typing.Union, types.UnionType):
            inner = [a for a in typing.get_args(t) if a is not type(None)]
            t = inner[0] if len(inner) == 1 else None
        cls = t
    return t


_BOOLS = {"true", "false", "yes", "no", "on", "off", "y", "n", "1", "0"}


def _wrong_type(arg: str, key: str, value: str, schema: type) -> str | None:
    """One line for a number or boolean key given a value that is not one (`trainer.batch_size=two`), else None (also
    for what Hydra resolves itself: an interpolation, a quoted value, a sweep)."""
    t = _field_type(schema, key)
    if t not in (int, float, bool) or value.lower() == "null" or "${" in value or value[:1] in "'\"" or "," in value:
        return None
    try:
        if t is bool:
            ok = value.lower() in _BOOLS
        else:
            t(value)
            ok = t is not int or float(value).is_integer()
    except ValueError:
        ok = False
    if ok:
        return None
    kind = {int: "a whole number", float: "a number", bool: "true or false"}[t]
    default = next((f.default for f in _all_fields(schema, key)), dataclasses.MISSING)
    example = f"{key}={default}" if default is not dataclasses.MISSING else f"{key}=1"
    return f"{arg}: {key} takes {kind}, not {value!r}; e.g. {example.replace('True', 'true').replace('False', 'false')}"


def _all_fields(schema: type, key: str) -> Iterator[dataclasses.Field]:
    """The dataclass field of the dotted `key` (nothing when it is not one)."""
    *parents, leaf = key.split(".")
    cls: Any = schema
    for part in parents:
        cls = _field_type(cls, part)
        if cls is None or not dataclasses.is_dataclass(cls):
            return
    yield from (f for f in dataclasses.fields(cls) if f.name == leaf)


def group_options(conf_dir: Path, groups: set[str]) -> dict[str, set[str]]:
    """Each config group's options: the names of its yaml files."""
    return {g: {p.stem for p in (conf_dir / g).glob("*.yaml")} for g in groups if (conf_dir / g).is_dir()}


def quiet_loading_bars() -> None:
    """Off a terminal, transformers' and the Hub's own bars (loading weights) would write carriage returns into the
    log: turned off there."""
    if sys.stderr.isatty():
        return
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging

    logging.disable_progress_bar()
    disable_progress_bars()


@contextmanager
def refusals_in_one_line(
    prog: str,
    schema: type,
    conf_dir: Path,
    primary: str,
    keys_hint: str,
    exit_code: int,
    groups: set[str] | None = None,
) -> Iterator[None]:
    """Around a `@hydra.main` call: Hydra's refusal of the command line (an undeclared key, a group without its +, a
    value of the wrong type) ends the process as `<prog>: error: <one line>` with `exit_code`, no traceback.
    `groups`: the config groups the command chooses from (default: the sub-folders of `conf_dir`). Off a terminal the
    loading bars of transformers and the Hub are turned off for the command (`quiet_loading_bars`)."""
    from unittest import mock

    quiet_loading_bars()

    from hydra.errors import CompactHydraException

    try:  # HYDRA_FULL_ERROR: Hydra raises its refusal to the caller instead of printing it
        with mock.patch.dict(os.environ, {"HYDRA_FULL_ERROR": "1"}):
            yield
    except CompactHydraException as e:
        in_defaults = default_groups(conf_dir / f"{primary}.yaml")
        groups = config_groups(conf_dir) if groups is None else groups
        line = refusal_line(sys.argv[1:], schema, groups, in_defaults, keys_hint, group_options(conf_dir, groups))
        hydra_says = " ".join(f"{e} {e.__cause__ or ''}".split())  # Hydra's message (and OmegaConf's) on one line
        print(f"{prog}: error: {line or hydra_says}", file=sys.stderr)
        sys.exit(exit_code)

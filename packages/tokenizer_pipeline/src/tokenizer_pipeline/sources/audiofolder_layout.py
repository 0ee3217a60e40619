"""Which metadata files of an audiofolder are read, and their splits: the way `datasets` finds them
(`datasets.data_files.get_data_patterns` + `packaged_modules/folder_based_builder`), or a refusal.

The first of datasets' rules that matches any file decides (sharded `data/<split>-*` files, `*.eval` logs, task files:
no metadata read; split folders at any depth, named by a keyword such as `train/`, `data/test/`, `dev.other/`; split
keywords in file names; else every file is "train"). Any metadata file this leaves unread, a file in two splits,
metadata of two formats, or a `.zip` stops the run with one line listing them (the first `MAX_LISTED`). Symlinked
folders are never walked, only their top is looked at.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .track import SourceError, shown

METADATA_NAMES = ("metadata.csv", "metadata.jsonl", "metadata.parquet")
SPLIT_KEYWORDS = {  # datasets.data_files.SPLIT_KEYWORDS, in its order
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
OUR_SPLIT = {"train": "train", "validation": "eval", "test": "eval"}  # datasets' split -> ours (Track.split)
KEYWORD_BOUNDS = "-._ 0123456789"  # datasets.data_files.NON_WORDS_CHARS
MAX_LISTED = 10  # files named in one refusal; the rest are counted
FILES_TO_IGNORE = ("README.md", "config.json", "dataset_info.json", "dataset_infos.json", "dummy_data.zip",
                   "dataset_dict.json")  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """The metadata files read, each with datasets' split name ("train" | "validation" | "test"), or None when the
    folder names no split (datasets calls it all "train"; we split by hash)."""

    splits: dict[Path, str | None]

    def our_split(self, mfile: Path) -> str | None:
        """Track.split of a metadata file's rows: "train" | "eval" | None (by hash)."""
        hf = self.splits[mfile]
        return None if hf is None else OUR_SPLIT[hf]


def _has_keyword(name: str, keyword: str, whole_name_ok: bool) -> bool:
    """`keyword` in `name`, bounded on each side by a KEYWORD_BOUNDS char or the name's end (datasets' four
    `{kw}`, `{kw}[sep]*`, `*[sep]{kw}`, `*[sep]{kw}[sep]*` globs; file names need a char after the keyword)."""
    start = name.find(keyword)
    while start >= 0:
        end = start + len(keyword)
        left = start == 0 or name[start - 1] in KEYWORD_BOUNDS
        right = name[end] in KEYWORD_BOUNDS if end < len(name) else whole_name_ok
        if left and right:
            return True
        start = name.find(keyword, start + 1)
    return False


def _dir_splits(rel: PurePosixPath) -> set[str]:
    """datasets' splits whose folder patterns (`**/{kw}[sep]*/**`, ...) match the file `rel`."""
    return {s for s, kws in SPLIT_KEYWORDS.items() for d in rel.parts[:-1] for k in kws if _has_keyword(d, k, True)}


def _name_has_split(rel: PurePosixPath) -> bool:
    return any(_has_keyword(rel.name, k, False) for kws in SPLIT_KEYWORDS.values() for k in kws)


def _is_sharded(rel: PurePosixPath) -> bool:
    """`data/{split}-[0-9]{5}-of-[0-9]{5}*.*` (datasets.data_files.SPLIT_PATTERN_SHARDED)."""
    if len(rel.parts) != 2 or rel.parts[0] != "data":
        return False
    head, sep, tail = rel.name.partition("-of-")
    return bool(sep) and head[-6:-5] == "-" and head[-5:].isdigit() and tail[:5].isdigit() and "." in tail[5:]


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a link to itself (ELOOP): datasets skips it too
        return False


def listed(items: list[str]) -> str:
    """The first MAX_LISTED items, comma-separated, then "and N more": a refusal stays one readable line."""
    more = len(items) - MAX_LISTED
    return ", ".join(items[:MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def _linked_metadata(root: Path, link: Path) -> list[PurePosixPath]:
    """The metadata files directly in a symlinked folder that leads outside root (one inside root is walked at its
    real place); never walked further, so a link to / costs a few stats."""
    try:
        if link.resolve().is_relative_to(root.resolve()):
            return []
    except (OSError, RuntimeError):  # a link loop: nothing to read
        return []
    rel = PurePosixPath(link.relative_to(root).as_posix())
    return [rel / n for n in METADATA_NAMES if (link / n).is_file()]


def _walk(root: Path) -> tuple[list[PurePosixPath], list[PurePosixPath]]:
    """(the files datasets resolves, relative to root; every metadata file under root). Real folders only: a
    symlinked folder is never entered (datasets skips it); metadata directly in one is listed, to be refused."""
    resolved: list[PurePosixPath] = []
    metadata: list[PurePosixPath] = []
    real = [root]
    while real:
        top = real.pop()
        try:
            entries = sorted(os.scandir(top), key=lambda e: e.name, reverse=True)
        except OSError:  # an unreadable folder: datasets does not enter it either
            continue
        for e in entries:
            rel = PurePosixPath(Path(e.path).relative_to(root).as_posix())
            if _is_dir(e):
                if e.is_symlink():
                    metadata += _linked_metadata(root, Path(e.path))
                else:
                    real.append(Path(e.path))
                continue
            if not os.path.isfile(e.path):  # a broken link, a socket, a link loop
                continue
            if e.name in METADATA_NAMES:
                metadata.append(rel)
            hidden = any(p.startswith(".") and set(p) != {"."} for p in rel.parts)
            special = any(p.startswith("__") for p in rel.parts[:-1])
            if not (hidden or special or e.name in FILES_TO_IGNORE):
                resolved.append(rel)
    return sorted(resolved), sorted(metadata)


def _resolved_splits(files: list[PurePosixPath]) -> tuple[str, dict[PurePosixPath, set[str]]]:
    """(the rule that decides, file -> datasets' splits it is read in) for the files datasets resolves."""
    if any(_is_sharded(f) for f in files):
        return "sharded data/<split>-00000-of-00001.* files", {}
    if any(f.name.endswith(".eval") for f in files):
        return "*.eval log files", {}
    if any(f.name in ("task.toml", "instruction.md") for f in files):
        return "task.toml / instruction.md files", {}
    by_dir = {f: _dir_splits(f) for f in files}
    if any(by_dir.values()):
        return "split folders", {f: s for f, s in by_dir.items() if s}
    if any(_name_has_split(f) for f in files):
        return "split names in file names (e.g. train_01.wav)", {}
    return "no split", {f: {"train"} for f in files}


def find_layout(root: Path) -> Layout:
    """The metadata files `datasets.load_dataset("audiofolder", data_dir=root)` reads, with their splits; SourceError
    when there are none, or when any metadata file under root would be left unread."""
    if not root.is_dir():
        raise SourceError(f"audiofolder source.dir={root} is not a directory")
    resolved, on_disk = _walk(root)
    archives = [shown(str(f)) for f in resolved if f.suffix.lower() == ".zip"]
    if archives:
        raise SourceError(
            f"audiofolder {root}: {len(archives)} zip archive(s) ({listed(archives)}): datasets reads the audio and "
            "metadata inside them, we do not: unzip each into its own folder here (e.g. `unzip x.zip -d x`) and "
            "delete the .zip"
        )
    rule, splits_of = _resolved_splits(resolved)
    read = {f: s for f, s in splits_of.items() if f.name in METADATA_NAMES}
    unread = [f for f in on_disk if f not in read]
    if unread:
        raise SourceError(
            f"audiofolder {root}: {len(unread)} metadata file(s) would not be read ({listed([shown(str(f)) for f in unread])}): datasets' audiofolder "
            f"reads none of them here (the layout is decided by {rule}; hidden, __special and symlinked folders are "
            "never read); move each next to its audio inside the split folder it belongs to (train/, test/, "
            "validation/), or delete it"
        )
    both = sorted(shown(str(f)) for f, s in read.items() if len(s) > 1)
    if both:
        raise SourceError(
            f"audiofolder {root}: {listed(both)} lie in folders of two splits (e.g. train/test/); datasets reads "
            "them in both, which would put the same tracks in train and eval: rename one of the folders"
        )
    formats = sorted({f.suffix for f in read})
    if len(formats) > 1:
        raise SourceError(
            f"audiofolder {root}: metadata files of {len(formats)} formats ({listed([shown(str(f)) for f in sorted(read)])}); "
            "datasets refuses mixed formats: keep one format (metadata.csv, metadata.jsonl or metadata.parquet)"
        )
    if not read:
        raise SourceError(
            f"audiofolder {root} has no {', '.join(METADATA_NAMES)} (in it, or in a split folder such as train/, "
            "test/ or data/validation/); write one with a file_name column and a caption column"
        )
    named = rule == "split folders"
    return Layout({root / f: (next(iter(s)) if named else None) for f, s in sorted(read.items())})

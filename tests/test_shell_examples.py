"""Commands shown to users paste into any shell: a Hydra list override (`data.shards=[a,b]`) in the docs, the READMEs,
the config comments and the Makefile is quoted, since zsh reads an unquoted `[...]` as a glob and stops with "no
matches found" before Python starts."""

from __future__ import annotations

import re
from pathlib import Path

from tests import REPO

LIST_OVERRIDE = re.compile(r"[+~]{0,2}[A-Za-z_][\w.]*=\[")


def shown_files() -> list[Path]:
    """Where the project shows commands: docs/*.md, the READMEs, conf/**/*.yaml and the Makefile."""
    files = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", REPO / "Makefile"]
    files += sorted((REPO / "packages").glob("*/README.md")) + sorted((REPO / "conf").rglob("*.yaml"))
    return files


def unquoted_list_overrides(text: str) -> list[str]:
    """Each `key=[` of `text` whose override does not open with a quote (`'key=[...]'`, `"key=[...]"`), with its
    line number."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in LIST_OVERRIDE.finditer(line):
            if m.start() == 0 or line[m.start() - 1] not in "'\"":
                found.append(f"{n}: {line.strip()}")
    return found


def test_every_shown_list_override_is_quoted() -> None:
    found = [f"{p.relative_to(REPO)}:{hit}" for p in shown_files() for hit in unquoted_list_overrides(p.read_text())]
    assert not found, "quote these for zsh ('data.shards=[a,b]'):\n" + "\n".join(found)


def test_the_rule_sees_an_unquoted_override() -> None:
    assert unquoted_list_overrides("python -m adapter_trainer data.shards=[build/shards]") == [
        "1: python -m adapter_trainer data.shards=[build/shards]"
    ]
    assert len(unquoted_list_overrides("`+data.shards=[a]` and ~x.y=[1]")) == 2
    assert unquoted_list_overrides("python -m adapter_trainer 'data.shards=[a, b]' \"x=[1]\" data.shards=a,b") == []

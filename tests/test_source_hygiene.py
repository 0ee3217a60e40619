"""House rules on the repository's Python source, checked as text:

- no code, test or benchmark cites an issue number: a docstring or comment says what the code does or what the test
  protects, which stays true after the tracker is gone (an upstream project's bug, `pytorch#139550`, is a reference
  and may stay);
- no test edits the import path: a benchmark script is loaded from its file (`importlib.util.spec_from_file_location`,
  as tests/benchmarks/ does) or run as a subprocess, so no test's imports depend on which test ran before it
  (pytest's `monkeypatch.syspath_prepend`, undone after the test, is the one scoped exception).

Each rule is a function returning its findings, run below on the tree and on a copy of a file with the rule broken.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests import REPO

PYTHON_ROOTS = ("packages", "tests", "benchmarks", "scripts")
ISSUE_NUMBER = re.compile(r"\bissues?\s*#?\s*\d+", re.IGNORECASE)
PATH_EDIT = re.compile(r"\bsys\.path\s*(\.\s*(insert|append|extend)\b|\+=|\[[^\]]*\]\s*=)")


def _python_files(roots: list[Path]) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _matches(pattern: re.Pattern[str], roots: list[Path]) -> list[str]:
    found = []
    for path in _python_files(roots):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path}:{n}: {line.strip()}")
    return found


def issue_citations(roots: list[Path]) -> list[str]:
    """Lines of .py files under `roots` that cite an issue number."""
    return _matches(ISSUE_NUMBER, roots)


def import_path_edits(roots: list[Path]) -> list[str]:
    """Lines of .py files under `roots` that insert into, append to or assign the import path."""
    return _matches(PATH_EDIT, roots)


def test_no_source_cites_an_issue_number() -> None:
    roots = [REPO / r for r in PYTHON_ROOTS]
    assert len(_python_files(roots)) > 200  # the walk reaches the source it guards
    assert issue_citations(roots) == []


def test_no_test_edits_the_import_path() -> None:
    assert import_path_edits([REPO / "tests"]) == []


# a line that breaks each rule, made here so this file breaks neither
BROKEN = {
    "issue number": (issue_citations, "# keeps the order (see " + "Issue" + " #" + "12)"),
    "issue number, no #": (issue_citations, '    """Fixes the crash of ' + "issue" + " 7" + '."""'),
    "insert": (import_path_edits, "sys.path" + ".insert(0, str(REPO / 'benchmarks'))"),
    "append": (import_path_edits, "sys.path" + ".append('benchmarks')"),
    "slice": (import_path_edits, "sys.path" + "[:0] = ['benchmarks']"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_rule_broken_in_a_copy_is_caught(tmp_path: Path, case: str) -> None:
    rule, line = BROKEN[case]
    copy = tmp_path / "tests" / "test_copy.py"
    copy.parent.mkdir()
    shutil.copyfile(Path(__file__), copy)
    assert rule([tmp_path]) == [], "the unchanged copy must pass"
    copy.write_text(copy.read_text(encoding="utf-8") + line + "\n", encoding="utf-8")
    assert rule([tmp_path]), f"{rule.__name__} did not catch {line!r}"

"""House rules a newcomer relies on, checked as text:

- the code, the configs and the Makefile say what is: no project date in packages/*/src, conf/ or the Makefile
  (dates and figures belong on docs/results.md);
- the Makefile's comments are one line per target or variable (a `# ---- section` header may stand above one);
- the docs stay readable in one sitting: README.md, docs/*.md and the package READMEs together hold at most
  MAX_DOC_WORDS words (`wc -w`).

Each rule is a function returning its findings, run below on the tree and on a copy with the rule broken.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests import REPO

MAX_DOC_WORDS = 25_000
PROJECT_DATE = re.compile(r"\b20[2-9]\d-[01]\d-[0-3]\d\b")
CODE_AND_CONFIG = ("packages/adapter_trainer/src", "packages/tokenizer_pipeline/src", "conf", "Makefile")


def _text_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".yml", ".toml", ".md"))


def project_dates(repo: Path) -> list[str]:
    """`path:line: text` for each line of code, config or Makefile that holds a project-era ISO date."""
    found = []
    for root in CODE_AND_CONFIG:
        for path in _text_files(repo / root):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if PROJECT_DATE.search(line):
                    found.append(f"{path.relative_to(repo)}:{n}: {line.strip()}")
    return found


def long_makefile_comments(makefile: Path) -> list[str]:
    """The first line of each Makefile comment block longer than one line (a `# ----` header not counted)."""
    found, run = [], []
    for n, line in enumerate([*makefile.read_text(encoding="utf-8").splitlines(), ""], 1):
        if line.startswith("#") and not line.startswith("# ----"):
            run.append(n)
            continue
        if len(run) > 1:
            found.append(f"{makefile.name}:{run[0]}: a comment of {len(run)} lines")
        run = []
    return found


def doc_files(repo: Path) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md")), *sorted((repo / "packages").glob("*/README.md"))]


def doc_words(repo: Path) -> int:
    return sum(len(p.read_text(encoding="utf-8").split()) for p in doc_files(repo))


def test_code_config_and_makefile_hold_no_project_dates() -> None:
    assert project_dates(REPO) == []


def test_makefile_comments_are_one_line_each() -> None:
    assert long_makefile_comments(REPO / "Makefile") == []


def test_the_docs_stay_within_their_word_budget() -> None:
    assert len(doc_files(REPO)) >= 10  # the walk reaches the pages it guards
    words = doc_words(REPO)
    assert words <= MAX_DOC_WORDS, f"the docs hold {words} words (at most {MAX_DOC_WORDS}): cut repetition, not content"


def _copy_tree(tmp_path: Path) -> Path:
    for root in CODE_AND_CONFIG:
        src = REPO / root
        if src.is_file():
            shutil.copyfile(src, tmp_path / root)
        else:
            shutil.copytree(src, tmp_path / root, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_a_date_in_a_copy_of_the_code_is_caught(tmp_path: Path) -> None:
    repo = _copy_tree(tmp_path)
    assert project_dates(repo) == [], "the unchanged copy must pass"
    recipe = repo / "packages/adapter_trainer/src/adapter_trainer/training/recipe.py"
    recipe.write_text(recipe.read_text(encoding="utf-8") + "# the default since " + "2026-11-28\n", encoding="utf-8")
    assert len(project_dates(repo)) == 1


@pytest.mark.parametrize("block", ["# one\n# two\n", "# a\n# b\n# c\n"])
def test_a_long_makefile_comment_in_a_copy_is_caught(tmp_path: Path, block: str) -> None:
    copy = tmp_path / "Makefile"
    shutil.copyfile(REPO / "Makefile", copy)
    assert long_makefile_comments(copy) == [], "the unchanged copy must pass"
    copy.write_text(copy.read_text(encoding="utf-8") + "\n" + block + "x:\n\ttrue\n", encoding="utf-8")
    assert len(long_makefile_comments(copy)) == 1


def test_docs_over_the_budget_in_a_copy_are_caught(tmp_path: Path) -> None:
    for path in doc_files(REPO):
        target = tmp_path / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    assert doc_words(tmp_path) == doc_words(REPO)
    extra = MAX_DOC_WORDS - doc_words(tmp_path) + 1
    (tmp_path / "docs" / "new-page.md").write_text("word " * extra, encoding="utf-8")
    assert doc_words(tmp_path) > MAX_DOC_WORDS

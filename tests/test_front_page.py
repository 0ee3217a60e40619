"""README.md is the front page: what the project is, the two commands, what `make demo` leaves, where to go next.
Figures and long explanations belong to the docs/ page of their subject."""

from tests import REPO

MAX_README_LINES = 150  # a front page read top to bottom; what grows past it moves to docs/ with a link


def test_the_readme_stays_a_front_page() -> None:
    n = len((REPO / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move detail to docs/"

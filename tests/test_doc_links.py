"""Every relative link of the front page, the package READMEs and docs/*.md leads somewhere: the file exists, and
an `#anchor` into a markdown file names one of its headings (GitHub's slugs) or an explicit `<a id="...">`.
Links inside code blocks and code spans are text, not links; `http(s)://` and `mailto:` links are not checked."""

from __future__ import annotations

import re
from pathlib import Path

from tests import REPO

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def doc_files() -> list[Path]:
    """The pages people read: README.md, the package READMEs and docs/*.md."""
    return [REPO / "README.md", *sorted((REPO / "packages").glob("*/README.md")), *sorted((REPO / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of `text` outside fenced code blocks."""
    out, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if fence is None:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lowercase, punctuation dropped (letters, digits, '_', '-' and spaces
    stay), each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text only
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a markdown file: its headings' slugs (a repeated slug gets -1, -2, ...) and `<a id>`s."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        found.update(HTML_ID.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(files: list[Path]) -> list[str]:
    """`file:line: target (why)` for each relative link of `files` whose file or anchor does not exist."""
    broken, cache = [], {}
    for path in files:
        for n, line in prose_lines(path.read_text(encoding="utf-8")):
            for target in LINK.findall(CODE_SPAN.sub("", line)):
                if not target or EXTERNAL.match(target):
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (path.parent / file_part).resolve() if file_part else path
                where = f"{path.name}:{n}: {target}"
                if not dest.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and dest.suffix == ".md":
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if anchor not in cache[dest]:
                        broken.append(f"{where} (no heading with this anchor)")
    return broken


def test_every_relative_link_leads_somewhere() -> None:
    files = doc_files()
    assert len(files) >= 10  # the walk reaches the pages it guards
    assert broken_links(files) == []


def test_slugs_follow_github() -> None:
    assert slug("Learning check of `make demo`") == "learning-check-of-make-demo"
    assert slug("Your own audio: `source=audiocraft` / `source=audiofolder`") == (
        "your-own-audio-sourceaudiocraft--sourceaudiofolder"
    )
    assert (
        slug("MusicGen as it ships: the teacher, and the towers") == "musicgen-as-it-ships-the-teacher-and-the-towers"
    )
    assert slug("2. Get the weights, and pre-fill an offline node's cache") == (
        "2-get-the-weights-and-pre-fill-an-offline-nodes-cache"
    )


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Part\n\n## Part\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md) [ok](other.md#part) [ok](other.md#part-1) [ok](#page) [web](https://example.org/x.md#y)\n"
        "`[code](missing.md)`\n```\n[fenced](missing.md)\n# not a heading\n```\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [bad here](#not-a-heading) [third](other.md#part-2)\n",
        encoding="utf-8",
    )
    assert broken_links([page]) == [
        "page.md:9: missing.md (no such file)",
        "page.md:9: other.md#nope (no heading with this anchor)",
        "page.md:9: #not-a-heading (no heading with this anchor)",
        "page.md:9: other.md#part-2 (no heading with this anchor)",
    ]

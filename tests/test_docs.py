"""The README stays one screen and docs/ stays walkable (issue 61): the README at most 250 lines, each page
that took the README's sections opens with a table of contents that lists its headings, and every relative
link in README.md and docs/ reaches an existing file and heading (sections moved; links must follow).
Text only: no model, no JAX."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250
# The pages the README's sections moved into (issue 61); each opens with a table of contents.
PAGES_WITH_TOC = ["cli", "models", "serving", "python_api", "performance", "scaling", "web", "testing"]
TOC = re.compile(r"<!-- toc -->\n(.*?)<!-- /toc -->", re.S)


def prose_lines(text: str) -> list[str]:
    """The lines outside ``` fences (a `# comment` in a shell block is no heading)."""
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            out.append(line)
    return out


def headings(text: str) -> list[tuple[int, str, str]]:
    """(level, title, GitHub's anchor) of each heading: lower case, punctuation dropped, spaces to hyphens,
    a repeated anchor numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = []
    for line in prose_lines(text):
        m = re.match(r"(#{1,6}) (.+)", line)
        if m:
            anchor = re.sub(r"[^\w\- ]", "", m.group(2).strip().lower()).replace(" ", "-")
            n = seen.get(anchor, 0)
            seen[anchor] = n + 1
            out.append((len(m.group(1)), m.group(2), f"{anchor}-{n}" if n else anchor))
    return out


def expected_toc(text: str) -> str:
    return "".join("  " * (level - 2) + f"- [{title}](#{anchor})\n"
                   for level, title, anchor in headings(text) if level in (2, 3))


def test_the_readme_is_one_screen():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail into docs/"


@pytest.mark.parametrize("name", PAGES_WITH_TOC)
def test_each_page_opens_with_its_table_of_contents(name):
    text = (ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8")
    toc = TOC.search(text)
    assert toc, f"docs/{name}.md has no <!-- toc --> ... <!-- /toc --> block"
    assert text.index("\n## ") > toc.start(), f"docs/{name}.md: the table of contents must come before the first section"
    body = text[toc.end():]
    assert toc.group(1) == expected_toc(body), f"docs/{name}.md's table of contents is stale; it should read:\n{expected_toc(body)}"


def test_every_relative_link_reaches_its_file_and_heading():
    anchors = {page: {a for _, _, a in headings(page.read_text(encoding="utf-8"))} for page in PAGES}
    broken = []
    for page in PAGES:
        for line in prose_lines(page.read_text(encoding="utf-8")):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                linked = (page.parent / path).resolve() if path else page
                if not linked.exists():
                    broken.append(f"{page.name}: {target} (no such file)")
                elif anchor and linked.suffix == ".md":
                    known = anchors.get(linked) or {a for _, _, a in headings(linked.read_text(encoding="utf-8"))}
                    if anchor not in known:
                        broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)

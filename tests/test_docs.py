"""The README and docs/: links that resolve, code blocks that compile, a README that stays a landing page.

The examples themselves run in ``tests/spark/test_doc_examples.py``, which reads the blocks with
``code_blocks`` below. The convention is in docs/development.md, "Examples in the docs are tested".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
# About 400 lines was the goal when the README was cut down to a landing page; this keeps it from
# growing back without failing on one extra line.
README_MAX_LINES = 420

_FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
_MARKER = re.compile(r"^<!--\s*(.*?)\s*-->$")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced code block: where it starts (the line after the fence, 1-based), its language and text,
    and the HTML comment on the line before the fence, if any (``not run: …``, ``needs delta``)."""

    path: Path
    line: int
    lang: str
    code: str
    marker: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def code_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, lang = opening.groups()
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(before)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence)), None)
        assert end is not None, f"{path.name}:{i + 1}: a code block that never closes"
        blocks.append(Block(path, i + 2, lang.lower(), "\n".join(lines[i + 1 : end]), marker.group(1) if marker else None))
        i = end + 1
    return blocks


def prose(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside code blocks, with inline code taken out: a link or a heading
    inside code is an example, not a link."""
    lines = path.read_text(encoding="utf-8").splitlines()
    inside: set[int] = set()
    for block in code_blocks(path):
        inside.update(range(block.line - 1, block.line + block.code.count("\n") + 1))
    return [(n, _CODE_SPAN.sub("", text)) for n, text in enumerate(lines, 1) if n not in inside and not _FENCE.match(text)]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered (no link targets, code or emphasis marks),
    lower case, without punctuation but hyphens and underscores, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    inside: set[int] = set()
    for block in code_blocks(path):
        inside.update(range(block.line - 1, block.line + block.code.count("\n") + 1))
    seen: dict[str, int] = {}
    found = set()
    for n, text in enumerate(lines, 1):
        heading = _HEADING.match(text)
        if n in inside or not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")  # GitHub numbers repeated headings
    return found


def relative_links(path: Path) -> list[tuple[int, str]]:
    out = []
    for n, text in prose(path):
        for target in _LINK.findall(text):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked here
                out.append((n, target))
    return out


def test_the_docs_exist_and_the_readme_links_every_page() -> None:
    assert DOCS, "docs/ holds no page"
    linked = {(README.parent / target.split("#")[0]).resolve() for _, target in relative_links(README)}
    assert [p.name for p in DOCS if p.resolve() not in linked] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for n, target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{page.name}:{n}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{page.name}:{n}: {target} (no heading with that anchor in {dest.name})")
        elif anchor and dest.suffix != ".md":
            broken.append(f"{page.name}:{n}: {target} (an anchor into a file that is not Markdown)")
    assert broken == []


def test_the_readme_stays_a_landing_page() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail into docs/ (a page per concept)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_parse(page: Path) -> None:
    """Blocks that are not run (and the JSON examples) still have to be valid, or they mislead."""
    for block in code_blocks(page):
        if block.lang == "python":
            compile(block.code, block.name, "exec")
        elif block.lang == "json":
            json.loads(block.code)


def test_markers_are_ones_the_example_runner_knows() -> None:
    # A misspelt marker would silently run a block meant to be skipped, or skip the Delta mark.
    for page in PAGES:
        for block in code_blocks(page):
            if block.marker is not None and block.lang == "python":
                assert block.marker == "needs delta" or block.marker.startswith("not run: "), block.name


def test_the_slugs_follow_github() -> None:
    assert slug("Filtered reads (RabbitMQ 3.13+)") == "filtered-reads-rabbitmq-313"
    assert slug("Backlog in the query's progress") == "backlog-in-the-querys-progress"
    assert slug("Connecting: network, TLS, logins") == "connecting-network-tls-logins"
    assert slug("`tls.*` options and [links](x.md)") == "tls-options-and-links"
    assert slug("Writing over AMQP 0-9-1") == "writing-over-amqp-0-9-1"

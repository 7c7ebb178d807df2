"""The README and docs/ read as Markdown: the pages, their fenced code blocks, prose, headings' anchors,
relative links and option tables. ``tests/test_docs.py`` checks the pages with these,
``tests/test_option_docs.py`` their option tables against the code, and ``tests/spark/test_doc_examples.py``
runs the code blocks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

_FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
_MARKER = re.compile(r"^<!--\s*(.*?)\s*-->$")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_OPTION_HEADER = re.compile(r"^\|\s*option\s*\|")


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


def _inside_blocks(path: Path) -> set[int]:
    inside: set[int] = set()
    for block in code_blocks(path):
        inside.update(range(block.line - 1, block.line + block.code.count("\n") + 1))
    return inside


def prose(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside code blocks, with inline code taken out: a link or a heading
    inside code is an example, not a link."""
    lines = path.read_text(encoding="utf-8").splitlines()
    inside = _inside_blocks(path)
    return [(n, _CODE_SPAN.sub("", text)) for n, text in enumerate(lines, 1) if n not in inside and not _FENCE.match(text)]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered (no link targets, code or emphasis marks),
    lower case, without punctuation but hyphens and underscores, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    inside = _inside_blocks(path)
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


def option_rows(path: Path) -> list[tuple[int, str]]:
    """(line number, option) for each option a table of ``path`` documents: the tables whose first column is
    headed ``option``, each row naming one or more options in code spans in that column (``tls.*`` for a
    family documented elsewhere)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    inside = _inside_blocks(path)
    found = []
    n = 0
    while n < len(lines):
        if n + 1 in inside or not _OPTION_HEADER.match(lines[n]):
            n += 1
            continue
        n += 2  # the header and its | --- | line
        while n < len(lines) and lines[n].startswith("|"):
            first_column = lines[n].split("|")[1]
            found += [(n + 1, name) for name in re.findall(r"`([^`]+)`", first_column)]
            n += 1
    return found

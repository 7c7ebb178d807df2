"""The README and docs/: links that resolve, code blocks that compile, a README that stays a landing page.

The pages are read with ``tests/markdown.py``; the examples themselves run in ``tests/spark/test_doc_examples.py``
and the option tables are checked against the code in ``tests/test_option_docs.py``. The convention is in
docs/development.md, "Examples in the docs are tested".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .markdown import DOCS, PAGES, README, ROOT, anchors, code_blocks, relative_links, slug

# The README is a landing page of about 240 lines: a margin of about 20 leaves room for a short paragraph, and
# fails as soon as a section grows back (its detail belongs on a page of docs/).
README_MAX_LINES = 260


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

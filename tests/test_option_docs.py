"""The option tables of docs/ against the option keys the code accepts: every key has a row, spelt as the code
spells it (``OptionReader`` takes any case, but users copy what the docs show), on the page of its mode, and
every option a table names is one the code accepts. A key added without its row, or a row left behind by a
removed or renamed key, fails here with what is missing where."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_amqp.queues.options import SOURCE_KEYS
from spark_amqp.sink.options import SINK_KEYS
from spark_amqp.streams.options import STREAM_KEYS
from spark_amqp.transport.options import CONNECTION_KEYS

from .markdown import DOCS, ROOT, option_rows

DOCS_DIR = ROOT / "docs"
# Each mode's page, and where its keys come from. The connection's keys (every mode takes them) may have their
# row on any page: most are on the queue source's, TLS and logins on managed-brokers.md, loadBalancer on streams.md.
MODES = {
    "queue-source.md": (SOURCE_KEYS, "SOURCE_KEYS (spark_amqp/queues/options.py)"),
    "streams.md": (STREAM_KEYS, "STREAM_KEYS (spark_amqp/streams/options.py)"),
    "sink.md": (SINK_KEYS, "SINK_KEYS (spark_amqp/sink/options.py)"),
}
CONNECTION = set(CONNECTION_KEYS.values())


def documented(page: Path) -> set[str]:
    return {name for _, name in option_rows(page)}


@pytest.mark.parametrize("page", sorted(MODES))
def test_every_option_of_a_mode_has_a_row_on_its_page(page: str) -> None:
    keys, source = MODES[page]
    missing = sorted(set(keys.values()) - CONNECTION - documented(DOCS_DIR / page))
    assert missing == [], f"docs/{page} has no option-table row for {', '.join(missing)}, which {source} accepts"


def test_every_connection_option_has_a_row_on_some_page() -> None:
    everywhere = set().union(*(documented(page) for page in DOCS))
    missing = sorted(CONNECTION - everywhere)
    assert missing == [], f"no option table in docs/ has a row for {', '.join(missing)}, which CONNECTION_KEYS accepts"


@pytest.mark.parametrize("page", [p for p in DOCS if option_rows(p)], ids=lambda p: p.name)
def test_every_option_a_table_names_is_one_the_code_accepts(page: Path) -> None:
    """On a mode's page, a key of that mode; elsewhere, a connection key. ``tls.*`` names a family of keys."""
    accepted = set(MODES[page.name][0].values()) if page.name in MODES else CONNECTION
    if page.name == "amqp-1.0.md":  # a protocol's page, over every mode: any mode's key
        accepted = {key for keys, _ in MODES.values() for key in keys.values()}
    unknown = []
    for line, name in option_rows(page):
        family = name.removesuffix("*") if name.endswith(".*") else None
        if name not in accepted and not (family and any(key.startswith(family) for key in accepted)):
            near = sorted(key for key in accepted if key.lower() == name.lower())
            unknown.append(f"docs/{page.name}:{line}: `{name}`" + (f" (the code spells it {near[0]})" if near else ""))
    assert unknown == [], "option-table rows for keys the code does not accept:\n" + "\n".join(unknown)

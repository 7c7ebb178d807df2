"""``BatchJournal``: planned micro-batches on durable storage, for exact replays.

RabbitMQ cannot replay a queue, so a batch Spark replays after a restart must
come from here; and since its messages are acknowledged as soon as it is here
(the journal keeps them from then on), a batch Spark never saw must come from
here too. Each batch is two files, written before ``latestOffset`` returns its
end offset and before any of its messages is acknowledged:

* ``batch-<n>.arrows``: the batch's partitions as Arrow IPC streams, back to back;
* ``batch-<n>.json``: the manifest, written last, so a batch without one was
  never planned and is ignored: start and end offset keys, the partitions'
  sizes, each message's fingerprint per queue (what recognises a copy the
  broker redelivers when an ack was lost), and ``acking``: acks may have been
  sent, so not every copy comes back.

An empty ``batch-<n>.committed`` marks a batch Spark committed whose entry is
kept a while longer (copies may still come back): a query started on a new
checkpoint knows it need not read it again. Version 1 manifests (no
``acking``: an empty ``batch-<n>.acking`` said it) are read too.

``n`` increases across runs, so manifests sort in planning order. Files are
deleted once Spark committed the batch and the broker has provably processed
its acks, or when its copies have stopped coming back within the retention bound.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..errors import AmqpSourceError

log = logging.getLogger("spark_amqp.queues")

VERSION = 2
READS = (1, 2)
PREFIX = "batch-"
SUFFIXES = (".json", ".arrows", ".acking", ".committed")


@dataclass(frozen=True)
class JournalEntry:
    number: int
    start: str  # AmqpSourceOffset.key of the batch's start
    end: str  # ... and of its end
    part_sizes: tuple[int, ...]
    # queue -> fingerprints of its messages in the batch, ("id", message id) or ("fp", digest)
    fingerprints: Mapping[str, tuple[tuple[str, str], ...]] = field(repr=False)
    acking: bool = False
    committed: bool = False

    @property
    def rows(self) -> int:
        return sum(len(f) for f in self.fingerprints.values())


@dataclass(frozen=True)
class Recovery:
    """What a restarted query makes of its journal, given where Spark resumes."""

    committed: list[JournalEntry]  # in Spark's commit log: their copies may still come back
    replayed: JournalEntry | None  # logged, not committed: Spark runs it again
    pending: list[JournalEntry]  # never logged by Spark: the next batches, in order
    discard: list[JournalEntry]  # superseded, or known to be committed by an earlier checkpoint
    stale: bool = False  # Spark starts from scratch: ``pending`` is chained anew from the initial offset


def classify(entries: Sequence[JournalEntry], frontier: str, replay: str | None, initial: str, display: str) -> Recovery:
    """Sort the journal against Spark's offsets.

    ``frontier`` is the start of the batch Spark asks for next or replays,
    ``replay`` the end of a batch it replays. A batch planned from the frontier
    (and any planned after it) was journalled, and perhaps acknowledged, but
    the process died before Spark logged its offset: the sink never saw it, so
    it is the next batch. Starting from the initial offset means a new
    checkpoint (or a first run that died before Spark logged its first batch):
    whatever of the journal is not known to be committed may never have reached
    a sink, and is read again.
    """
    ours = set(json.loads(initial)["queues"])
    for entry in entries:
        theirs = set(json.loads(entry.end)["queues"])
        if theirs != ours:
            raise AmqpSourceError(
                f"option 'journalLocation' {display} holds batches of a query reading {', '.join(sorted(theirs))}, "
                f"not {', '.join(sorted(ours))}: give every query its own journal"
            )
    if replay is None and frontier == initial:
        done = [e for e in entries if e.committed]
        return Recovery([], None, [e for e in entries if not e.committed], done, stale=bool(entries))
    replayed = next((e for e in entries if e.end == replay), None) if replay else None
    pending: list[JournalEntry] = []
    superseded: list[JournalEntry] = []  # a journal of version 1 planned a lost batch's start again
    key = replayed.end if replayed else frontier
    while following := [e for e in entries if e.start == key and e not in pending and e not in superseded and e is not replayed]:
        pending.append(following[-1])
        superseded.extend(following[:-1])
        key = following[-1].end
    committed = [e for e in entries if e not in pending and e not in superseded and e is not replayed]
    return Recovery(committed, replayed, pending, superseded)


class _Store(Protocol):
    def put(self, name: str, data: bytes) -> None: ...
    def get(self, name: str) -> bytes: ...
    def names(self) -> list[str]: ...
    def delete(self, name: str) -> None: ...


class _LocalStore:
    """A local (or FUSE-mounted, e.g. a Databricks volume) directory: temp file, fsync, rename."""

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, exist_ok=True)

    def put(self, name: str, data: bytes) -> None:
        path = os.path.join(self.root, name)
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def get(self, name: str) -> bytes:
        with open(os.path.join(self.root, name), "rb") as f:
            return f.read()

    def names(self) -> list[str]:
        return os.listdir(self.root)

    def delete(self, name: str) -> None:
        try:
            os.remove(os.path.join(self.root, name))
        except FileNotFoundError:
            pass


class _ArrowStore:
    """Any filesystem pyarrow (or fsspec, through pyarrow) reaches; object writes are atomic."""

    def __init__(self, fs: Any, root: str) -> None:
        self.fs, self.root = fs, root.rstrip("/")
        fs.create_dir(self.root, recursive=True)

    def put(self, name: str, data: bytes) -> None:
        with self.fs.open_output_stream(f"{self.root}/{name}") as out:
            out.write(data)

    def get(self, name: str) -> bytes:
        with self.fs.open_input_stream(f"{self.root}/{name}") as src:
            return bytes(src.read())

    def names(self) -> list[str]:
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        return [info.base_name for info in infos]

    def delete(self, name: str) -> None:
        try:
            self.fs.delete_file(f"{self.root}/{name}")
        except FileNotFoundError:
            pass


def _open_store(location: str) -> _Store:
    scheme = urllib.parse.urlsplit(location).scheme
    if scheme in ("", "file") or len(scheme) == 1:  # a plain path (or a Windows drive letter)
        path = urllib.parse.urlsplit(location).path if scheme == "file" else location
        return _LocalStore(os.path.abspath(path))
    import pyarrow.fs as pafs

    try:
        fs, root = pafs.FileSystem.from_uri(location)
    except (ValueError, OSError):  # pyarrow's ArrowInvalid is a ValueError: a scheme it does not know
        try:
            import fsspec
        except ImportError:
            raise AmqpSourceError(
                f"option 'journalLocation': pyarrow does not know the filesystem of {scheme}:// and fsspec is not installed"
            ) from None
        try:
            inner, root = fsspec.core.url_to_fs(location)
        except (ValueError, ImportError) as err:  # an unknown protocol, or its package is missing
            raise AmqpSourceError(f"option 'journalLocation': neither pyarrow nor fsspec can open {scheme}:// ({err})") from None
        fs = pafs.PyFileSystem(pafs.FSSpecHandler(inner))
    return _ArrowStore(fs, root)


class BatchJournal:
    def __init__(self, location: str, display: str) -> None:
        self.display = display
        try:
            self.store = _open_store(location)
        except OSError as err:
            raise AmqpSourceError(f"option 'journalLocation': cannot open {display}: {err}") from None
        self._next = 1

    def load(self) -> list[JournalEntry]:
        """Every complete entry, oldest first; leftovers of interrupted writes are removed."""
        names = set(self.store.names())
        entries = []
        for name in sorted(names):
            if name.startswith(PREFIX) and name.endswith(".json"):
                number = int(name[len(PREFIX) : -len(".json")])
                stem = _stem(number)
                entries.append(self._read_manifest(number, f"{stem}.acking" in names, f"{stem}.committed" in names))
        complete = {f"{_stem(e.number)}{suffix}" for e in entries for suffix in SUFFIXES}
        for name in names - complete:
            if name.startswith(PREFIX):
                self.store.delete(name)
        if entries:
            self._next = entries[-1].number + 1
        return entries

    def write(self, start: str, end: str, parts: Sequence[bytes], fingerprints: Mapping[str, list[tuple[str, str]]]) -> JournalEntry:
        """A new batch, whose acks follow (``acking``)."""
        number = self._next
        self._next += 1
        entry = JournalEntry(number, start, end, tuple(len(p) for p in parts), {q: tuple(f) for q, f in fingerprints.items()}, True)
        self._put(f"{_stem(number)}.arrows", b"".join(parts))
        self._put_manifest(entry)
        return entry

    def restart_from(self, entry: JournalEntry, start: str) -> JournalEntry:
        """``entry`` planned again from ``start`` (a batch of an earlier checkpoint read again)."""
        moved = replace(entry, start=start)
        self._put_manifest(moved)
        return moved

    def _put_manifest(self, entry: JournalEntry) -> None:
        manifest = {
            "v": VERSION,
            "start": entry.start,
            "end": entry.end,
            "parts": list(entry.part_sizes),
            "fingerprints": {q: [list(f) for f in fps] for q, fps in entry.fingerprints.items()},
            "acking": entry.acking,
            "written": time.time(),
        }
        self._put(f"{_stem(entry.number)}.json", json.dumps(manifest, separators=(",", ":")).encode())

    def _put(self, name: str, data: bytes) -> None:
        try:
            self.store.put(name, data)
        except OSError as err:
            raise AmqpSourceError(f"cannot write the batch journal at {self.display}: {err}") from None

    def parts(self, entry: JournalEntry) -> list[bytes]:
        data = self.store.get(f"{_stem(entry.number)}.arrows")
        if len(data) != sum(entry.part_sizes):
            raise AmqpSourceError(
                f"batch journal {self.display}: {_stem(entry.number)}.arrows holds {len(data)} bytes, "
                f"its manifest says {sum(entry.part_sizes)}; the journal was modified or truncated"
            )
        out, pos = [], 0
        for size in entry.part_sizes:
            out.append(data[pos : pos + size])
            pos += size
        return out

    def mark_committed(self, entry: JournalEntry) -> JournalEntry:
        self._put(f"{_stem(entry.number)}.committed", b"")
        return replace(entry, committed=True)

    def delete(self, entry: JournalEntry) -> None:
        # Manifest first: an entry without one is a leftover, never a batch.
        for suffix in SUFFIXES:
            self.store.delete(f"{_stem(entry.number)}{suffix}")

    def _read_manifest(self, number: int, acking: bool, committed: bool) -> JournalEntry:
        try:
            data: dict[str, Any] = json.loads(self.store.get(f"{_stem(number)}.json"))
            if data.get("v") not in READS:
                raise ValueError(f"unsupported version {data.get('v')!r}")
            fps = {q: tuple((str(k), str(v)) for k, v in items) for q, items in data["fingerprints"].items()}
            acking = acking or bool(data.get("acking"))
            parts = tuple(int(s) for s in data["parts"])
            return JournalEntry(number, data["start"], data["end"], parts, fps, acking, committed)
        except (ValueError, KeyError, TypeError) as err:
            raise AmqpSourceError(f"batch journal {self.display}: {_stem(number)}.json is not a journal manifest ({err})") from None


def _stem(number: int) -> str:
    return f"{PREFIX}{number:012d}"

"""Typed, case-insensitive access to an option map, and AMQP uris taken apart without leaking passwords.

The pieces every options module (``transport/options.py``, the reading modes', the sink's) validates with;
every error names the option.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from .errors import AmqpOptionError

__all__ = ["SPARK_KEYS", "OptionReader", "ambiguity", "keyed", "redact_uri", "split_uri"]


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)?")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

# Keys Spark itself adds to a data source's options: writeStream's queryName() arrives as one too.
SPARK_KEYS = frozenset({"path", "checkpointlocation", "queryname"})


def keyed(*names: str) -> dict[str, str]:
    """Option keys as an ``OptionReader`` knows them: lower case -> the documented spelling."""
    return {k.lower(): k for k in names}


class OptionReader:
    """Typed access to a case-insensitive option map, with errors that name the option."""

    def __init__(self, options: Mapping[str, str], known: dict[str, str]) -> None:
        self.known = known
        self.values: dict[str, str] = {}
        for key, value in options.items():
            lower = key.lower()
            if lower in SPARK_KEYS:
                continue
            if lower not in known:
                valid = ", ".join(sorted(known.values(), key=str.lower))
                raise AmqpOptionError(f"unknown option '{key}'; valid options are: {valid}")
            self.values[lower] = value

    def name(self, key: str) -> str:
        return self.known[key.lower()]

    def text(self, key: str, default: str | None = None) -> str | None:
        value = self.values.get(key.lower())
        if value is None:
            return default
        return str(value)

    def required(self, key: str, hint: str) -> str:
        value = self.text(key)
        if value is None or value.strip() == "":
            raise AmqpOptionError(f"option '{self.name(key)}' is required: {hint}")
        return value

    def integer(self, key: str, default: int | None, low: int, high: int | None = None) -> int | None:
        raw = self.text(key)
        if raw is None:
            return default
        try:
            value = int(raw.strip())
        except ValueError:
            raise AmqpOptionError(f"option '{self.name(key)}' must be a whole number, got {raw!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise AmqpOptionError(f"option '{self.name(key)}' must be {bounds}, got {value}")
        return value

    def number(self, key: str, default: float, low: float, high: float) -> float:
        """A finite number of seconds in [low, high]: inf or nan would make a wait endless or never end."""
        raw = self.text(key)
        if raw is None:
            return default
        try:
            value = float(raw.strip())
        except ValueError:
            raise AmqpOptionError(f"option '{self.name(key)}' must be a number, got {raw!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise AmqpOptionError(
                f"option '{self.name(key)}' must be a number of seconds between {low:g} and {high:g}, got {raw.strip()!r}"
            )
        return value

    def names(self, key: str, noun: str) -> tuple[str, ...]:
        """A required comma-separated list of queue or stream names: none empty, none twice, none over 255 bytes."""
        raw = self.required(key, f"one {noun} name, or several separated by commas")
        names = tuple(n.strip() for n in raw.split(","))
        if any(n == "" for n in names):
            raise AmqpOptionError(f"option '{self.name(key)}' has an empty name in {raw!r}")
        if len(set(names)) != len(names):
            raise AmqpOptionError(f"option '{self.name(key)}' names a {noun} twice: {raw!r}")
        for n in names:
            if len(n.encode("utf-8")) > 255:
                raise AmqpOptionError(f"option '{self.name(key)}': name longer than 255 bytes: {n[:40]!r}...")
        return names

    def duration(self, key: str, default: float, low: float, high: float) -> float:
        """Seconds, from a number of seconds or a number with a unit: ``500ms``, ``30s``, ``15m``, ``1h``."""
        raw = self.text(key)
        if raw is None:
            return default
        match = _DURATION.fullmatch(raw.strip().lower())
        if match is None:
            raise AmqpOptionError(f"option '{self.name(key)}' must be a duration such as 30s, 15m or 1h, got {raw!r}")
        value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
        if not (math.isfinite(value) and low <= value <= high):
            raise AmqpOptionError(f"option '{self.name(key)}' must be between {low:g}s and {high:g}s, got {raw.strip()!r}")
        return value

    def readable_file(self, key: str) -> str | None:
        path = self.text(key)
        if path is None:
            return None
        if not os.path.isfile(path):
            raise AmqpOptionError(f"option '{self.name(key)}': no such file: {path}")
        if not os.access(path, os.R_OK):
            raise AmqpOptionError(f"option '{self.name(key)}': file not readable by this process: {path}")
        return path

    def boolean(self, key: str, default: bool) -> bool:
        raw = self.text(key)
        if raw is None:
            return default
        lowered = raw.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise AmqpOptionError(f"option '{self.name(key)}' must be true or false, got {raw!r}")

    def json_object(self, key: str) -> dict[str, Any]:
        raw = self.text(key)
        if raw is None:
            return {}
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as err:
            raise AmqpOptionError(f"option '{self.name(key)}' must be a JSON object: {err.msg} at position {err.pos}") from None
        if not isinstance(value, dict):
            raise AmqpOptionError(f"option '{self.name(key)}' must be a JSON object, got {type(value).__name__}")
        return value


def split_uri(uri: str) -> tuple[str, str | None, str]:
    """(scheme, userinfo or None, the rest). Userinfo runs to the last '@', so that an unencoded '#', '?' or '/'
    in a password neither ends it nor shows up in an error as part of the host or path."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return "", None, uri
    userinfo, at, address = rest.rpartition("@")
    if not at or "/" in userinfo.partition(":")[0]:
        return scheme.lower(), None, rest  # no '@', or it belongs to the path: no credentials here
    return scheme.lower(), userinfo, address


def ambiguity(uri: str) -> str | None:
    """Why ``uri`` cannot be read one way only, or None. Never guessed: an unencoded '/' in a user name makes
    the user the host and the password part of the path (shown in every log line); an unencoded '@' in the
    vhost makes what follows it the host."""
    _, sep, rest = uri.partition("://")
    userinfo, at, address = rest.rpartition("@")
    if not sep or not at:
        return None
    if "/" in userinfo.partition(":")[0]:
        return "a '/' before the last '@' and before any ':'"
    if "@" in userinfo and "/" not in address:
        return "an '@' before the last '@', and nothing after the last '@' that looks like host/vhost"
    return None


def redact_uri(uri: str) -> str:
    """A uri as typed by the user, minus any password, for error messages."""
    scheme, userinfo, address = split_uri(uri)
    if userinfo is None:
        if "@" in uri.partition("://")[2]:
            return f"{scheme}://… (not shown: it may hold a password)"
        return uri if scheme else "<not a uri>"
    user, has_password, _ = userinfo.partition(":")
    return f"{scheme}://{user}{':***' if has_password else ''}@{address}"

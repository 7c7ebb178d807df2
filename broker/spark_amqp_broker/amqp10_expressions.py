"""Filter expressions on a stream's receiving link, as RabbitMQ 4.3 evaluates them (AMQP Filter Expressions 1.0):
``amqp:properties-filter`` and ``amqp:application-properties-filter`` (each named value must match; a string starting
``&p:`` is a prefix, ``&s:`` a suffix, ``&&`` a literal ``&``), and ``amqp:sql-filter``, an SQL expression.

A message goes to the link only when its expression is true: false and unknown (SQL's NULL) both leave it out, and
its offset never comes. What RabbitMQ cannot parse it leaves out of the attach's answer without an error, so an
expression that does not parse here is not taken either. The SQL's details were read off RabbitMQ 4.3.6 on this
machine, one expression at a time (``tests/streams/test_expression_filters.py`` runs the same on both): identifiers
``p.``/``properties.`` name a property (``p.correlation_id``), ``h.``/``header.`` the header's priority (4 when
absent), ``a.``/``application_properties.`` or no prefix an application property; ``BETWEEN`` and exponents without
a decimal point are not taken; comparing values of different kinds is false, and arithmetic on them unknown.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any

from spark_amqp.amqp10.message import PROPERTY_NAMES, Sections, sections
from spark_amqp.amqp10.types import Described

__all__ = ["Expression", "take"]

PROPERTIES_FILTER = "amqp:properties-filter"
APPLICATION_FILTER = "amqp:application-properties-filter"
SQL_FILTER = "amqp:sql-filter"
MAX_LENGTH, MAX_TOKENS = 4096, 200  # RabbitMQ's limits (filtex 7.1)
DEFAULT_PRIORITY = 4
_PROPERTY_OF_FILTER = {name.replace("_", "-"): i for i, name in enumerate(PROPERTY_NAMES)}
_PROPERTY_OF_SQL = {name: i for i, name in enumerate(PROPERTY_NAMES)}
_KEYWORDS = {"AND", "OR", "NOT", "LIKE", "IN", "IS", "NULL", "ESCAPE", "TRUE", "FALSE"}
_TOKEN = re.compile(
    r"\s*(?:(?P<float>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<int>\d+)|(?P<string>'(?:[^']|'')*')"
    r"|(?P<name>[a-zA-Z_$][a-zA-Z0-9_$.\-]*)|(?P<op><>|!=|>=|<=|[=<>+\-*/%(),]))"
)

Node = Callable[[Sections], Any]  # a parsed expression: its value for a message (None: unknown)


class Unparsable(Exception):
    """An expression RabbitMQ would leave out of its answer."""


class Expression:
    """The filter expressions one link took: ``matches`` a stream record's delivery, as the link sends it."""

    def __init__(self, tests: list[Callable[[Sections], bool]]) -> None:
        self.tests = tests

    def matches(self, delivery: bytes) -> bool:
        message = sections(delivery)
        return all(test(message) for test in self.tests)


def take(filters: dict[Any, Any]) -> tuple[Expression | None, dict[Any, Any]]:
    """The expression of a source's filter set, and the entries taken (for the attach's answer)."""
    tests: list[Callable[[Sections], bool]] = []
    taken: dict[Any, Any] = {}
    for key, value in filters.items():
        kind = str(value.descriptor) if isinstance(value, Described) else None
        try:
            if kind == PROPERTIES_FILTER:
                tests.append(_properties_test(value.value))
            elif kind == APPLICATION_FILTER:
                tests.append(_application_test(value.value))
            elif kind == SQL_FILTER:
                tests.append(_sql_test(value.value))
            else:
                continue
        except Unparsable:
            continue
        taken[key] = value
    return (Expression(tests) if tests else None), taken


# -- property filters -----------------------------------------------------------------------------


def _matches_value(wanted: Any, actual: Any) -> bool:
    if isinstance(wanted, str) and wanted.startswith("&"):
        if wanted.startswith("&p:"):
            return isinstance(actual, str) and actual.startswith(wanted[3:])
        if wanted.startswith("&s:"):
            return isinstance(actual, str) and actual.endswith(wanted[3:])
        if wanted.startswith("&&"):
            wanted = wanted[1:]
    return _equal(wanted, actual) is True


def _properties_test(wanted: Any) -> Callable[[Sections], bool]:
    if not isinstance(wanted, dict):
        raise Unparsable
    indexes = {}
    for name, value in wanted.items():
        if str(name) not in _PROPERTY_OF_FILTER:
            raise Unparsable
        indexes[_PROPERTY_OF_FILTER[str(name)]] = value

    def test(message: Sections) -> bool:
        props = message.properties
        return all(i < len(props) and _matches_value(value, props[i]) for i, value in indexes.items())

    return test


def _application_test(wanted: Any) -> Callable[[Sections], bool]:
    if not isinstance(wanted, dict):
        raise Unparsable
    pairs = [(str(k), v) for k, v in wanted.items()]

    def test(message: Sections) -> bool:
        app = message.application_properties
        return all(name in app and _matches_value(value, app[name]) for name, value in pairs)

    return test


# -- SQL --------------------------------------------------------------------------------------------


def _sql_test(sql: Any) -> Callable[[Sections], bool]:
    if not isinstance(sql, str) or len(sql) > MAX_LENGTH:
        raise Unparsable
    node = _Parser(_tokens(sql)).parse()
    return lambda message: node(message) is True


def _tokens(sql: str) -> list[tuple[str, Any]]:
    tokens: list[tuple[str, Any]] = []
    at = 0
    while sql[at:].strip():
        m = _TOKEN.match(sql, at)
        if m is None:
            raise Unparsable
        at = m.end()
        kind = m.lastgroup
        text = m.group(kind)  # type: ignore[arg-type]
        if kind == "float":
            tokens.append(("value", float(text)))
        elif kind == "int":
            tokens.append(("value", int(text)))
        elif kind == "string":
            tokens.append(("string", text[1:-1].replace("''", "'")))
        elif kind == "name" and text.upper() in _KEYWORDS:
            word = text.upper()
            tokens.append(("value", word == "TRUE") if word in ("TRUE", "FALSE") else (word, None))
        else:
            tokens.append((str(kind), text))
    if len(tokens) > MAX_TOKENS:
        raise Unparsable
    return tokens


class _Parser:
    """Recursive descent over RabbitMQ's grammar: OR < AND < NOT < comparisons < + - < * / % < unary + -."""

    def __init__(self, tokens: list[tuple[str, Any]]) -> None:
        self.tokens = tokens
        self.at = 0

    def peek(self, kind: str, text: Any = None) -> bool:
        if self.at >= len(self.tokens):
            return False
        k, t = self.tokens[self.at]
        return k == kind and (text is None or t == text)

    def take(self, kind: str, text: Any = None) -> Any:
        if not self.peek(kind, text):
            raise Unparsable
        self.at += 1
        return self.tokens[self.at - 1][1]

    def parse(self) -> Node:
        node = self.logical()
        if self.at != len(self.tokens):
            raise Unparsable
        return node

    def logical(self) -> Node:
        node = self.conjunction()
        while self.peek("OR"):
            self.at += 1
            node = _junction(node, self.conjunction(), True)
        return node

    def conjunction(self) -> Node:
        node = self.negation()
        while self.peek("AND"):
            self.at += 1
            node = _junction(node, self.negation(), False)
        return node

    def negation(self) -> Node:
        if self.peek("NOT"):
            self.at += 1
            return _not(self.negation())
        return self.comparison()

    def comparison(self) -> Node:
        start = self.at
        left = self.additive()
        identifier = self.at == start + 1 and self.tokens[start][0] == "name"  # IS NULL takes an identifier alone
        if self.peek("op") and self.tokens[self.at][1] in _COMPARE:
            op = _COMPARE[self.take("op")]
            right = self.additive()
            return lambda m: _compare(op, left(m), right(m))
        negated = False
        if self.peek("NOT"):
            self.at += 1
            negated = True
        if self.peek("LIKE"):
            self.at += 1
            pattern = _like_pattern(self.take("string"), self.take("string") if self._escape() else None)
            node: Node = lambda m: _like(pattern, left(m))  # noqa: E731
        elif self.peek("IN"):
            self.at += 1
            self.take("op", "(")
            options = [self.additive()]
            while self.peek("op", ","):
                self.at += 1
                options.append(self.additive())
            self.take("op", ")")
            node = lambda m: _in(left(m), [o(m) for o in options])  # noqa: E731
        elif self.peek("IS") and not negated and identifier:
            self.at += 1
            is_not = self.peek("NOT")
            self.at += is_not
            self.take("NULL")
            return (lambda m: left(m) is not None) if is_not else (lambda m: left(m) is None)
        elif negated:
            raise Unparsable
        else:
            return left
        return _not(node) if negated else node

    def _escape(self) -> bool:
        if self.peek("ESCAPE"):
            self.at += 1
            return True
        return False

    def additive(self) -> Node:
        node = self.multiplicative()
        while self.peek("op", "+") or self.peek("op", "-"):
            op = self.take("op")
            node = _arithmetic(op, node, self.multiplicative())
        return node

    def multiplicative(self) -> Node:
        node = self.unary()
        while self.peek("op", "*") or self.peek("op", "/") or self.peek("op", "%"):
            op = self.take("op")
            node = _arithmetic(op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.peek("op", "+") or self.peek("op", "-"):
            sign = -1 if self.take("op") == "-" else 1
            inner = self.primary()
            return lambda m: sign * v if _number(v := inner(m)) else None
        return self.primary()

    def primary(self) -> Node:
        if self.peek("op", "("):
            self.at += 1
            node = self.logical()
            self.take("op", ")")
            return node
        if self.peek("value") or self.peek("string"):
            value = self.tokens[self.at][1]
            self.at += 1
            return lambda m: value
        name = self.take("name")
        if self.peek("op", "("):
            if name.upper() != "UTC":
                raise Unparsable
            self.take("op", "(")
            self.take("op", ")")
            return lambda m: int(time.time() * 1000)
        return _identifier(name)


_COMPARE = {"=": "=", "<>": "<>", "!=": "<>", ">": ">", "<": "<", ">=": ">=", "<=": "<="}


def _identifier(name: str) -> Node:
    prefix, _, field = name.partition(".")
    if field and prefix in ("p", "properties"):
        if field not in _PROPERTY_OF_SQL:
            raise Unparsable
        index = _PROPERTY_OF_SQL[field]
        return lambda m: m.properties[index] if index < len(m.properties) else None
    if field and prefix in ("h", "header"):
        if field != "priority":
            raise Unparsable
        return lambda m: m.header[1] if len(m.header) > 1 and m.header[1] is not None else DEFAULT_PRIORITY
    key = field if field and prefix in ("a", "application_properties") else name
    return lambda m: m.application_properties.get(key)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _equal(a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    if _number(a) and _number(b):
        return bool(a == b)
    return (type(a) is type(b) and a == b) or (isinstance(a, str) and isinstance(b, str) and a == b)


def _compare(op: str, a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    if op == "=":
        return _equal(a, b)
    if op == "<>":
        return not _equal(a, b)
    if not ((_number(a) and _number(b)) or (isinstance(a, str) and isinstance(b, str))):
        return False
    return bool({">": a > b, "<": a < b, ">=": a >= b, "<=": a <= b}[op])


def _arithmetic(op: str, left: Node, right: Node) -> Node:
    def value(m: Sections) -> Any:
        a, b = left(m), right(m)
        if not (_number(a) and _number(b)):
            return None
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if b == 0:
            return None
        if op == "/":
            return a / b
        if isinstance(a, float) or isinstance(b, float):
            return None  # rem: integers only
        return int(math.fmod(a, b))

    return value


def _junction(left: Node, right: Node, deciding: bool) -> Node:
    """AND (``deciding`` False) or OR (True) with SQL's unknown: a side of the deciding value decides; both sides of the
    other value give it; anything else is unknown."""

    other = not deciding

    def value(m: Sections) -> bool | None:
        a: bool | None = left(m)  # a value that is no boolean (a bare number) counts as unknown here
        if a is deciding:
            return deciding
        b: bool | None = right(m)
        if b is deciding:
            return deciding
        return other if a is other and b is other else None

    return value


def _not(inner: Node) -> Node:
    def value(m: Sections) -> bool | None:
        v = inner(m)
        return None if v is None or not isinstance(v, bool) else not v

    return value


def _in(value: Any, options: list[Any]) -> bool | None:
    if value is None:
        return None
    return any(_equal(value, o) is True for o in options)


def _like_pattern(pattern: str, escape: str | None) -> re.Pattern[str]:
    if escape is not None and len(escape) != 1:
        raise Unparsable
    out = []
    chars = iter(pattern)
    for c in chars:
        if ord(c) < 32 or ord(c) == 127:
            raise Unparsable
        if c == escape:
            following = next(chars, None)
            if following is None:
                raise Unparsable
            out.append(re.escape(following))
        elif c == "%":
            out.append(".*?")
        elif c == "_":
            out.append(".")
        else:
            out.append(re.escape(c))
    return re.compile("".join(out), re.DOTALL)


def _like(pattern: re.Pattern[str], value: Any) -> bool | None:
    if not isinstance(value, str):
        return None
    return pattern.fullmatch(value) is not None

"""Option parsing: every bad input is a clear error naming the option, without the password."""

from __future__ import annotations

import pytest

from spark_amqp.errors import AmqpOptionError
from spark_amqp.option_reader import OptionReader
from spark_amqp.queues.options import parse_source_options
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.transport.endpoints import Endpoint
from spark_amqp.transport.options import parse_connection

BASE = {"uri": "amqp://alice:s3cret-pw@rabbit.example:5673/prod", "queue": "orders"}


def _parse(**extra: str):  # type: ignore[no-untyped-def]
    return parse_source_options({**BASE, **extra})


def test_defaults_and_uri_parts() -> None:
    o = _parse()
    c = o.connection
    assert (c.endpoints, c.vhost, c.username, c.password) == ((Endpoint("rabbit.example", 5673),), "prod", "alice", "s3cret-pw")
    assert c.tls is None and c.heartbeat == 60 and c.connection_timeout == 30.0
    assert o.queues == ("orders",) and o.prefetch >= 2 * o.max_messages_per_trigger and o.declaration is None


def test_password_option_overrides_and_never_shows() -> None:
    o = parse_source_options({"uri": "amqp://alice@h/%2F", "queue": "q", "password": "from-option"})
    assert o.connection.password == "from-option" and o.connection.vhost == "/"
    assert "from-option" not in repr(o) and "from-option" not in o.connection.display_uri
    assert "s3cret-pw" not in repr(_parse()) and _parse().connection.display_uri == "amqp://alice@rabbit.example:5673/prod"


def test_keys_are_case_insensitive_and_several_queues_split() -> None:
    o = parse_source_options({"URI": BASE["uri"], "Queue": " a , b ", "MAXMESSAGESPERTRIGGER": "10"})
    assert o.queues == ("a", "b") and o.max_messages_per_trigger == 10


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"queues": "x"}, "unknown option 'queues'; valid options are: "),
        ({"prefetch": "ten"}, "option 'prefetch' must be a whole number, got 'ten'"),
        ({"prefetch": "70000"}, "option 'prefetch' must be between 1 and 65535"),
        ({"maxMessagesPerTrigger": "0"}, "option 'maxMessagesPerTrigger' must be at least 1"),
        ({"maxMessagesPerTrigger": "5000", "prefetch": "6000"}, "'prefetch' (6000) must be at least twice 'maxMessagesPerTrigger' (5000)"),
        ({"numPartitions": "-2"}, "option 'numPartitions' must be between 1"),
        ({"heartbeat": "1.5"}, "option 'heartbeat' must be a whole number"),
        ({"connectionTimeout": "soon"}, "option 'connectionTimeout' must be a number"),
        ({"queue": "a,,b"}, "option 'queue' has an empty name"),
        ({"queue": "a,a"}, "names a queue twice"),
        ({"queue": " "}, "option 'queue' is required"),
        ({"tls.caFile": "/ca.pem"}, "tls.* options need an amqps:// uri"),
        ({"queueDurable": "true"}, "only apply with declareQueue=true"),
        ({"declareQueue": "maybe"}, "option 'declareQueue' must be true or false"),
        ({"declareQueue": "true", "queueArguments": "[1]"}, "option 'queueArguments' must be a JSON object"),
        ({"declareQueue": "true", "queueArguments": "{bad"}, "option 'queueArguments' must be a JSON object"),
    ],
)
def test_bad_options(extra: dict[str, str], fragment: str) -> None:
    with pytest.raises(AmqpOptionError) as info:
        _parse(**extra)
    assert fragment in str(info.value)
    assert "s3cret-pw" not in str(info.value)


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("http://alice:s3cret-pw@host/", "must start with amqp:// or amqps://"),
        ("amqp://alice:s3cret-pw@host:notaport/", "not a valid AMQP URI (the port of 'host:notaport' is not a number)"),
        ("amqp://alice:s3cret-pw@/vhost", "has no host"),
        ("amqp://alice:s3cret-pw@host/v?heartbeat=5", "must not carry query parameters"),
        ("", "option 'uri' is required"),
        ("rabbitmq-stream://alice:s3cret-pw@host/", "a stream-protocol uri (rabbitmq-stream://alice:***@host/), which is not taken here"),
    ],
)
def test_malformed_uris_name_the_option_and_hide_the_password(uri: str, fragment: str) -> None:
    with pytest.raises(AmqpOptionError) as info:
        parse_source_options({"uri": uri, "queue": "q"})
    assert fragment in str(info.value) and "s3cret-pw" not in str(info.value)


@pytest.mark.parametrize(
    ("uri", "port", "tls", "shown"),
    [
        ("rabbitmq-stream://alice@host/v", 5552, False, "rabbitmq-stream://alice@host:5552/v"),
        ("rabbitmq-stream+tls://alice@host:6000/", 6000, True, "rabbitmq-stream+tls://alice@host:6000/%2F"),
        ("amqps://alice@host/", 5671, True, "amqps://alice@host:5671/%2F"),
    ],
)
def test_stream_protocol_uris_where_they_are_taken(uri: str, port: int, tls: bool, shown: str) -> None:
    known = {"uri": "uri", "password": "password"}
    c = parse_connection(OptionReader({"uri": uri, "password": "s3cret-pw"}, known), stream_protocol=True)
    assert (c.endpoints[0].port, c.tls is not None, c.stream_protocol == uri.startswith("rabbitmq"), c.display_uri) == (
        port,
        tls,
        True,
        shown,
    )
    assert "s3cret-pw" not in repr(c)


def test_missing_queue_option() -> None:
    with pytest.raises(AmqpOptionError, match="option 'queue' is required"):
        parse_source_options({"uri": "amqp://h/"})


def test_tls_and_declaration(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked until a connection is made")
    o = parse_source_options(
        {
            "uri": "amqps://u@h/v",
            "queue": "q",
            "tls.caFile": str(ca),
            "tls.checkHostname": "false",
            "declareQueue": "true",
            "queueArguments": '{"x-queue-type": "quorum"}',
            "bindExchange": "events",
            "bindingKey": "orders.#",
        }
    )
    assert o.connection.endpoints == (Endpoint("h", 5671),) and o.connection.tls is not None and not o.connection.tls.check_hostname
    assert o.declaration is not None and o.declaration.arguments == {"x-queue-type": "quorum"}
    assert (o.declaration.exchange, o.declaration.binding_key, o.declaration.durable) == ("events", "orders.#", True)
    with pytest.raises(AmqpOptionError, match=r"'tls\.certFile' and 'tls\.keyFile' go together"):
        parse_source_options({"uri": "amqps://u@h/v", "queue": "q", "tls.certFile": str(ca)})


def test_tls_files_must_exist_and_be_readable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for key in ("tls.caFile", "tls.certFile", "tls.keyFile"):
        with pytest.raises(AmqpOptionError, match=f"option '{key}': no such file: /nowhere/x.pem"):
            parse_source_options({"uri": "amqps://u@h/v", "queue": "q", key: "/nowhere/x.pem"})
    unreadable = tmp_path / "key.pem"
    unreadable.write_text("secret")
    unreadable.chmod(0)
    import os

    if os.geteuid() != 0:  # root reads anything
        with pytest.raises(AmqpOptionError, match="file not readable"):
            parse_source_options({"uri": "amqps://u@h/v", "queue": "q", "tls.caFile": str(unreadable)})


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e9", "0"])
@pytest.mark.parametrize("key", ["connectionTimeout", "journalRetention"])
def test_numeric_options_refuse_infinite_and_absurd_values(key: str, value: str) -> None:
    extra = {"journalLocation": "/tmp/j"} if key == "journalRetention" else {}
    with pytest.raises(AmqpOptionError, match=f"option '{key}' must be a number of seconds between"):
        parse_source_options({**BASE, **extra, key: value})


@pytest.mark.parametrize("value", ["inf", "nan", "1e9", "0", "-1"])
def test_confirm_timeout_refuses_infinite_and_absurd_values(value: str) -> None:
    from spark_amqp.sink.options import parse_sink_options

    with pytest.raises(AmqpOptionError, match="option 'confirmTimeout' must be a number of seconds between"):
        parse_sink_options({"uri": "amqp://h/", "confirmTimeout": value})


def test_heartbeat_has_a_sane_ceiling() -> None:
    assert _parse(heartbeat="3600").connection.heartbeat == 3600
    with pytest.raises(AmqpOptionError, match="option 'heartbeat' must be between 0 and 3600"):
        _parse(heartbeat="65535")


@pytest.mark.parametrize("password", ["pa#ss", "pa?ss", "pa/ss", "p@ss#?/w:rd"])
def test_a_password_with_uri_delimiters_parses_and_never_shows(password: str) -> None:
    o = parse_source_options({"uri": f"amqp://alice:{password}@rabbit:5673/prod", "queue": "q"})
    c = o.connection
    assert (c.username, c.password, c.endpoints, c.vhost) == ("alice", password, (Endpoint("rabbit", 5673),), "prod")
    with pytest.raises(AmqpOptionError) as info:
        parse_source_options({"uri": f"amqp://alice:{password}@rabbit:bad/prod", "queue": "q"})
    assert password not in str(info.value) and "alice:***@rabbit:bad/prod" in str(info.value)


@pytest.mark.parametrize(
    "uri",
    [
        "amqp://team/etl:s3cret-pw@rabbit/prod",  # was: host 'team', user 'guest', the password in the vhost and every log line
        "amqp://team/etl@rabbit/prod",
        "amqp://alice:s3cret-pw@rabbit/v@x",  # was: host 'x'
        "amqp://rabbit/v@x",
    ],
)
def test_an_ambiguous_uri_is_refused_with_how_to_encode_it(uri: str) -> None:
    with pytest.raises(AmqpOptionError) as info:
        parse_source_options({"uri": uri, "queue": "q"})
    message = str(info.value)
    assert "can be read more than one way" in message and "%2F" in message and "%40" in message
    assert "s3cret-pw" not in message
    encoded = parse_source_options({"uri": "amqp://team%2Fetl:s3cret-pw@rabbit/v%40x", "queue": "q"}).connection
    assert (encoded.username, encoded.password, encoded.endpoints, encoded.vhost) == (
        "team/etl",
        "s3cret-pw",
        (Endpoint("rabbit", 5672),),
        "v@x",
    )


def test_stream_filter_options() -> None:
    from spark_amqp.streams.filtering import consumer_arguments
    from spark_amqp.streams.options import parse_stream_options

    base = {"uri": "amqp://h/", "stream": "s"}
    assert parse_stream_options(base).filter == () and consumer_arguments(parse_stream_options(base)) == {}
    one = parse_stream_options({**base, "filter": " eu "})
    assert one.filter == ("eu",) and consumer_arguments(one) == {"x-stream-filter": "eu"}
    several = parse_stream_options({**base, "filter": "eu,us,eu", "filterMatchUnfiltered": "true"})
    assert consumer_arguments(several) == {"x-stream-filter": ["eu", "us"], "x-stream-match-unfiltered": True}
    with pytest.raises(AmqpOptionError, match=r"option 'filter' takes comma-separated filter values, none of them empty; got 'eu,,us'"):
        parse_stream_options({**base, "filter": "eu,,us"})
    with pytest.raises(AmqpOptionError, match=r"option 'filterMatchUnfiltered' only applies with option 'filter'"):
        parse_stream_options({**base, "filterMatchUnfiltered": "true"})
    with pytest.raises(AmqpOptionError, match=r"option 'filterMatchUnfiltered' must be true or false"):
        parse_stream_options({**base, "filter": "eu", "filterMatchUnfiltered": "yes please"})


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"filterSql": "a = 1"}, r"option 'filterSql' is a filter RabbitMQ evaluates for AMQP 1.0 consumers only: set option 'protocol'"),
        ({"protocol": "amqp1.0", "filterSql": " "}, r"option 'filterSql' is empty"),
        (
            {"protocol": "amqp1.0", "filterSql": "a = 1", "filterApplicationProperties": '{"a": 1}'},
            r"option 'filterSql' excludes option 'filterApplicationProperties'",
        ),
        (
            {"protocol": "amqp1.0", "filterProperties": '{"colour": "red"}'},
            r"'colour' is not an AMQP 1.0 property; the properties are message-id",
        ),
        (
            {"protocol": "amqp1.0", "filterProperties": '{"creation-time": "today"}'},
            r"'creation-time' must be a non-negative integer \(milli",
        ),
        ({"protocol": "amqp1.0", "filterProperties": '{"subject": true}'}, r"'subject' must be a string or an integer, got true"),
        ({"protocol": "amqp1.0", "filterApplicationProperties": '{"a": [1]}'}, r"'a' must be a string, a number, true or false, got \[1\]"),
        ({"protocol": "amqp1.0", "filterProperties": "[1]"}, r"option 'filterProperties' must be a JSON object, got list"),
    ],
)
def test_stream_filter_expression_options_are_checked_up_front(given: dict[str, str], error: str) -> None:
    from spark_amqp.streams.options import parse_stream_options

    with pytest.raises(AmqpOptionError, match=error):
        parse_stream_options({"uri": "amqp://h", "stream": "s", **given})


def test_stream_filter_expressions_on_the_wire() -> None:
    from spark_amqp.amqp10.types import Described, Timestamp, UInt
    from spark_amqp.streams.options import parse_stream_options

    opts = parse_stream_options(
        {
            "uri": "amqp://h",
            "stream": "s",
            "protocol": "amqp1.0",
            "filterProperties": '{"subject": "&p:eu", "creation-time": 5, "group-sequence": 7}',
            "filterApplicationProperties": '{"region": "eu", "n": 2}',
        }
    )
    filters = opts.expression.source_filters()
    props = filters["amqp:properties-filter"]
    assert isinstance(props, Described) and props.descriptor == "amqp:properties-filter"
    assert props.value == {"subject": "&p:eu", "creation-time": 5, "group-sequence": 7}
    assert isinstance(props.value["creation-time"], Timestamp) and isinstance(props.value["group-sequence"], UInt)
    assert filters["amqp:application-properties-filter"] == Described("amqp:application-properties-filter", {"region": "eu", "n": 2})
    sql = parse_stream_options({"uri": "amqp://h", "stream": "s", "protocol": "amqp1.0", "filterSql": "p.subject = 'x'"})
    assert sql.expression.source_filters() == {"sql-filter": Described("amqp:sql-filter", "p.subject = 'x'")}


def test_sink_super_stream_and_filter_column_options() -> None:
    from spark_amqp.sink.options import parse_sink_options

    assert parse_sink_options({"uri": "amqp://h/"}).super_stream is None
    opts = parse_sink_options({"uri": "amqp://h/", "superStream": " orders ", "filterValueColumn": "region"})
    assert (opts.super_stream, opts.filter_value_column) == ("orders", "region")
    for key in ("exchange", "declareQueue"):
        with pytest.raises(AmqpOptionError, match=rf"options 'superStream' and '{key}' exclude each other"):
            parse_sink_options({"uri": "amqp://h/", "superStream": "orders", key: "x"})
    with pytest.raises(AmqpOptionError, match=r"option 'superStream' is empty"):
        parse_sink_options({"uri": "amqp://h/", "superStream": " "})
    with pytest.raises(AmqpOptionError, match=r"option 'filterValueColumn' takes the name of a string column"):
        parse_sink_options({"uri": "amqp://h/", "filterValueColumn": ""})


# -- several nodes in one uri (a cluster) ----------------------------------------------------------------


def _connection(uri: str, **extra: str):  # type: ignore[no-untyped-def]
    known = {"uri": "uri", "password": "password"}
    return parse_connection(OptionReader({"uri": uri, **extra}, known), stream_protocol=True)


@pytest.mark.parametrize(
    ("uri", "endpoints", "shown"),
    [
        (
            "amqp://alice:s3cret-pw@h1:5701,h2:5702,h3/prod",
            [("h1", 5701), ("h2", 5702), ("h3", 5672)],
            "amqp://alice@h1:5701,h2:5702,h3:5672/prod",
        ),
        ("amqps://alice@h1,h2:5000/%2F", [("h1", 5671), ("h2", 5000)], "amqps://alice@h1:5671,h2:5000/%2F"),
        (
            "rabbitmq-stream://alice@h1,h2,h3/",
            [("h1", 5552), ("h2", 5552), ("h3", 5552)],
            "rabbitmq-stream://alice@h1:5552,h2:5552,h3:5552/%2F",
        ),
        ("rabbitmq-stream+tls://alice@h1:6000,h2/v", [("h1", 6000), ("h2", 5551)], "rabbitmq-stream+tls://alice@h1:6000,h2:5551/v"),
        ("amqp://alice@[::1]:5701,[::1]:5702/%2F", [("::1", 5701), ("::1", 5702)], "amqp://alice@[::1]:5701,[::1]:5702/%2F"),
        (
            "amqp://alice@[2001:db8::1],10.1.2.3:5673",
            [("2001:db8::1", 5672), ("10.1.2.3", 5673)],
            "amqp://alice@[2001:db8::1]:5672,10.1.2.3:5673/%2F",
        ),
        ("amqp://Rabbit-1.Example.COM,rabbit-2.example.com/", [("rabbit-1.example.com", 5672), ("rabbit-2.example.com", 5672)], None),
    ],
)
def test_a_uri_names_several_nodes(uri: str, endpoints: list[tuple[str, int]], shown: str | None) -> None:
    c = _connection(uri)
    assert c.endpoints == tuple(Endpoint(h, p) for h, p in endpoints)
    assert isinstance(c.endpoints, tuple) and c.round_timeout == 30.0 * len(endpoints)
    if shown is not None:
        assert c.display_uri == shown
    assert "s3cret-pw" not in c.display_uri and "s3cret-pw" not in repr(c)


def test_endpoints_are_frozen() -> None:
    c = _connection("amqp://h1,h2/")
    with pytest.raises(AttributeError):
        c.endpoints[0].host = "elsewhere"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("amqp://alice:s3cret-pw@h1:5701,,h3/prod", "an empty host in the host list 'h1:5701,,h3'"),
        ("amqp://alice:s3cret-pw@h1,/prod", "an empty host"),
        ("amqp://alice:s3cret-pw@,h1/prod", "an empty host"),
        ("amqp://alice:s3cret-pw@h1:5701,h2:notaport/prod", "the port of 'h2:notaport' is not a number"),
        ("amqp://alice:s3cret-pw@h1:5701,h2:70000/prod", "the port of 'h2:70000' is not between 1 and 65535"),
        ("amqp://alice:s3cret-pw@h1:0/prod", "is not between 1 and 65535"),
        ("amqp://alice:s3cret-pw@h1:/prod", "the port of 'h1:' is not a number"),
        ("amqp://alice:s3cret-pw@::1:5672/prod", "write it between brackets"),
        ("amqp://alice:s3cret-pw@[::1:5672/prod", "never closes"),
        ("amqp://alice:s3cret-pw@[not-v6]:5672/prod", "is not an IPv6 address"),
        ("amqp://alice:s3cret-pw@h1,h1:5672/prod", "h1:5672 is named twice"),
        ("rabbitmq-stream://alice:s3cret-pw@h1:5552,h2:x/", "the port of 'h2:x' is not a number"),
    ],
)
def test_a_malformed_host_list_names_the_option_and_hides_the_password(uri: str, fragment: str) -> None:
    with pytest.raises(AmqpOptionError) as info:
        _connection(uri)
    message = str(info.value)
    assert message.startswith("option 'uri' is not a valid AMQP URI (") and fragment in message, message
    assert "s3cret-pw" not in message and "alice:***@" in message


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        # Was read as user 'guest@h' with the password '5701/%2F,amqp://guest', on host h:5702.
        ("amqp://guest@h:5701/%2F,amqp://guest@h:5702/%2F", "amqp://guest@h:5701/%2F, amqp://guest@h:5702/%2F"),
        ("amqp://alice:s3cret-pw@h1/%2F,amqp://alice:s3cret-pw@h2/%2F", "amqp://alice:***@h1/%2F, amqp://alice:***@h2/%2F"),
        ("amqp://a/%2F amqps://b/%2F", "amqp://a/%2F, amqps://b/%2F"),
        (
            "rabbitmq-stream://alice:s3cret-pw@h1:5552/;rabbitmq-stream+tls://h2/",
            "rabbitmq-stream://alice:***@h1:5552/, rabbitmq-stream+tls://h2/",
        ),
    ],
)
def test_two_uris_joined_are_refused_with_how_to_list_the_nodes(uri: str, shown: str) -> None:
    with pytest.raises(AmqpOptionError) as info:
        _connection(uri)
    message = str(info.value)
    assert f"option 'uri' holds more than one uri ({shown}): name every node in one uri" in message, message
    assert "amqp://user@host1:5672,host2:5672,host3:5672/vhost" in message and "s3cret-pw" not in message


def test_a_host_list_is_refused_before_anything_connects_in_every_mode() -> None:
    from spark_amqp.sink.options import parse_sink_options
    from spark_amqp.streams.options import parse_stream_options

    bad = "amqp://alice:s3cret-pw@h1,,h2/%2F"
    for parse in (
        lambda: parse_source_options({"uri": bad, "queue": "q"}),
        lambda: parse_stream_options({"uri": bad, "stream": "s"}),
        lambda: parse_sink_options({"uri": bad, "exchange": "x"}),
    ):
        with pytest.raises(AmqpOptionError, match="option 'uri' is not a valid AMQP URI") as info:
            parse()
        assert "s3cret-pw" not in str(info.value)


def test_the_keys_spark_adds_itself_are_not_refused_as_unknown() -> None:
    """writeStream.queryName(...) reaches a Python sink as option 'queryName' (seen on PySpark 4.3): a named
    streaming query into the sink failed with "unknown option 'queryname'"."""
    spark_adds = {"path": "/tmp/out", "checkpointLocation": "/tmp/c", "queryName": "orders-to-rabbit"}
    assert parse_sink_options({"uri": "amqp://h/", **spark_adds}).connection.endpoints
    assert parse_source_options({"uri": "amqp://h/", "queue": "q", **spark_adds}).queues == ("q",)

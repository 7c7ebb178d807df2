"""OAuth 2 tokens without a broker: when a connection renews, one fetch per process, what a token endpoint's
and a provider's answers mean, and the renewal timer; no error ever holds the client secret or a token."""

from __future__ import annotations

import asyncio
import datetime
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from spark_amqp.errors import AmqpProtocolError, TokenError, TokenUnavailable, explain, is_transient
from spark_amqp.transport import tokens
from spark_amqp.transport.auth_options import OAuth2Options
from spark_amqp.transport.renewal import Renewal
from spark_amqp.transport.tokens import Token, renew_at

from .driven_time import DrivenClock, run_in_driven_time, until
from .helpers import CLIENT_SECRET, TokenServer, options


def opaque(lifetime: float) -> str:
    return f"opaque-token-{uuid.uuid4().hex}"


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    tokens._tokens.clear()


@pytest.mark.parametrize(
    ("lifetime", "after"),
    [(3600.0, 2880.0), (600.0, 480.0), (300.0, 240.0), (120.0, 60.0), (90.0, 45.0), (15.0, 7.5), (2.0, 1.0), (0.0, 0.0)],
)
def test_renewal_comes_at_80_percent_or_a_minute_ahead_but_not_before_half_the_lifetime(lifetime: float, after: float) -> None:
    assert renew_at(1000.0, 1000.0 + lifetime) == pytest.approx(1000.0 + after)


def test_the_renewal_point_always_leaves_time_before_expiry() -> None:
    for lifetime in (1.0, 10.0, 59.0, 61.0, 299.0, 301.0, 7200.0, 86400.0):
        at = renew_at(0.0, lifetime)
        assert lifetime / 2 <= at <= lifetime - min(60.0, lifetime / 5) + 1e-9


def oauth2(server: TokenServer, scope: str | None = None) -> OAuth2Options:
    extra = {"oauth2.scope": scope} if scope else {}
    c = options("amqp://h/v", **server.options(**extra))
    assert c.oauth2 is not None
    return c.oauth2


def test_the_client_credentials_grant() -> None:
    with TokenServer(opaque, lifetime=120) as server:
        before = time.time()
        token = tokens.fetch(oauth2(server, scope="rabbitmq.read:*/*"), 5.0)
        request = server.requests[-1]
    assert token.value.startswith("opaque-token-") and before + 119 <= token.expires_at <= time.time() + 121
    assert request["form"] == {"grant_type": "client_credentials", "scope": "rabbitmq.read:*/*"}
    assert request["authorization"].startswith("Basic ")  # the secret travels in the header, as RFC 6749 2.3.1 asks
    assert token.value not in repr(token) and CLIENT_SECRET not in repr(oauth2(server))


def test_a_jwt_without_expires_in_is_renewed_by_its_exp_claim() -> None:
    import base64
    import json

    payload = base64.urlsafe_b64encode(json.dumps({"exp": 2_000_000_000}).encode()).rstrip(b"=").decode()
    assert tokens.jwt_expiry(f"e30.{payload}.sig") == 2_000_000_000.0
    assert tokens.jwt_expiry("not-a-jwt") is None and tokens.jwt_expiry("a.b!.c") is None


def test_connections_of_a_process_share_one_fetch() -> None:
    with TokenServer(opaque, lifetime=120) as server:
        source = oauth2(server)
        got: list[Token] = []
        threads = [threading.Thread(target=lambda: got.append(tokens.current(source, 5.0))) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert server.issued == 1 and len({t.value for t in got}) == 1
        renewed = tokens.current(source, 5.0, replacing=got[0])  # the connection that renews first fetches
        again = tokens.current(source, 5.0, replacing=got[0])  # the others get what it fetched
        assert renewed.value != got[0].value and again.value == renewed.value and server.issued == 2


def test_a_token_due_for_renewal_is_not_handed_to_a_new_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = DrivenClock()
    monkeypatch.setattr(tokens, "clock", clock)
    with TokenServer(opaque, lifetime=2) as server:
        source = oauth2(server)
        first = tokens.current(source, 5.0)
        clock.skip_to(first.obtained_at + 0.9)  # short of half of its 2 s
        assert tokens.current(source, 5.0).value == first.value and server.issued == 1
        clock.skip_to(first.obtained_at + 1.1)  # past half of its 2 s
        assert tokens.current(source, 5.0).value != first.value and server.issued == 2


def test_an_endpoint_that_refuses_is_a_permanent_error_about_the_token_without_the_secret() -> None:
    with TokenServer(opaque) as server:
        server.refusing = True
        with pytest.raises(TokenError) as info:
            tokens.current(oauth2(server), 5.0)
    said = str(info.value)
    assert "refused to issue a token for client 'spark-etl' (HTTP 401: invalid_client" in said and "oauth2.tokenEndpoint" in said
    assert CLIENT_SECRET not in said and not is_transient(info.value)  # the endpoint echoed it: scrubbed


def test_an_endpoint_that_fails_or_cannot_be_reached_is_worth_a_retry() -> None:
    with TokenServer(opaque) as server:
        server.failing = True
        with pytest.raises(TokenUnavailable, match=r"failed to issue a token \(HTTP 503: temporarily_unavailable\); retrying"):
            tokens.fetch(oauth2(server), 5.0)
        source = oauth2(server)
    with pytest.raises(TokenUnavailable, match=r"cannot reach the token endpoint http://127.0.0.1:\d+/oauth2/token .* for a token"):
        tokens.fetch(source, 2.0)  # the server is gone
    assert is_transient(TokenUnavailable("x"))


def provider_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    name = f"token_provider_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def provided(spec: str) -> OAuth2Options:
    c = options("amqp://h/v", **{"oauth2.tokenProvider": spec})
    assert c.oauth2 is not None
    return c.oauth2


def test_a_token_provider_returns_a_token_and_its_expiry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = provider_module(
        tmp_path,
        monkeypatch,
        """
        import datetime, time
        def aware():
            return "tok-aware", datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=10)
        def naive():  # taken as UTC
            return "tok-naive", datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) + datetime.timedelta(minutes=10)
        def epoch():
            return ("tok-epoch", time.time() + 600)
        class Sdk:
            @staticmethod
            def token():
                return ["tok-nested", int(time.time()) + 600]
        """,
    )
    for function in ("aware", "naive", "epoch", "Sdk.token"):
        token = tokens.fetch(provided(f"{module}:{function}"), 5.0)
        assert token.value.startswith("tok-") and 590 < token.expires_at - time.time() <= 600, function


@pytest.mark.parametrize(
    ("body", "fragment", "transient"),
    [
        ("def f():\n    return 'just-a-token'\n", "must return (token, expires_at), got str", False),
        ("def f():\n    return ('', 2e9)\n", "must return the token as a non-empty str", False),
        ("def f():\n    return ('t', 'tomorrow')\n", "must return the expiry as a datetime or seconds since the epoch, got str", False),
        ("import time\ndef f():\n    return ('t', time.time() - 30)\n", "returned a token that expired", False),
        ("def f():\n    raise PermissionError('role not assumable')\n", "could not get a token: PermissionError", True),
        ("def f():\n    raise ValueError('no tenant configured')\n", "failed to give a token: ValueError: no tenant configured", False),
        ("f = 42\n", "'f' is a int, not a function", False),
        ("def g():\n    pass\n", "has no 'f'", False),
    ],
)
def test_a_provider_that_misbehaves_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, fragment: str, transient: bool
) -> None:
    module = provider_module(tmp_path, monkeypatch, body)
    with pytest.raises(TokenError) as info:
        tokens.fetch(provided(f"{module}:f"), 5.0)
    assert fragment in str(info.value) and f"option 'oauth2.tokenProvider' ({module}:f)" in str(info.value)
    assert is_transient(info.value) is transient


def test_a_provider_that_cannot_be_imported_says_where_it_must_be() -> None:
    with pytest.raises(TokenError, match=r"cannot import module 'no_such_package.identity' \(ModuleNotFoundError"):
        tokens.fetch(provided("no_such_package.identity:token"), 5.0)


def test_explain_keeps_a_token_error_whole() -> None:
    err = TokenError("the token endpoint https://idp/token (option 'oauth2.tokenEndpoint') refused to issue a token")
    assert explain(err, "amqps://etl@rabbit:5671/prod", "etl", "prod") == f"amqps://etl@rabbit:5671/prod: {err}"


def test_renewal_hands_each_new_token_to_the_connection_at_its_renewal_point_before_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer alone, on a loop whose clock the test moves: hour-long tokens, each renewed when ``renew_at``
    says (48 minutes in) and not a minute earlier, three times; then a refusal ends it."""

    async def scenario(clock: DrivenClock) -> tuple[list[Token], list[AmqpProtocolError]]:
        loop = asyncio.get_running_loop()
        with TokenServer(opaque, lifetime=3600) as server:
            c = options("amqp://h/v", **server.options())
            assert c.oauth2 is not None
            first = await loop.run_in_executor(None, tokens.current, c.oauth2, 5.0, None)
            given: list[Token] = []
            failed: list[AmqpProtocolError] = []

            async def apply(token: Token) -> None:
                assert tokens.clock() < (given[-1] if given else first).expires_at  # before the token in use expires
                given.append(token)

            renewal = Renewal(loop, c, first, apply, failed.append, "test")
            renewal.start()
            for renewed in range(1, 4):
                in_use = given[-1] if given else first
                due = renew_at(in_use.obtained_at, in_use.expires_at)
                assert renewal.next_at == due
                clock.skip_to(due - 60)
                for _ in range(3):  # the loop's turns: a timer due by now would have run
                    await asyncio.sleep(0)
                assert renewal.next_at == due and len(given) == renewed - 1  # a minute early: not yet
                clock.skip_to(due)
                await until(lambda: failed or (len(given) == renewed and renewal.next_at is not None))  # noqa: B023
                assert failed == []
            server.refusing = True
            assert renewal.next_at is not None
            clock.skip_to(renewal.next_at)
            await until(lambda: failed)
            renewal.cancel()
            return given, failed

    given, failed = run_in_driven_time(monkeypatch, scenario)
    assert len(given) == 3 and len({t.value for t in given}) == len(given)
    assert len(failed) == 1 and isinstance(failed[0], TokenError) and "refused to issue a token" in str(failed[0])


def test_renewal_retries_an_unreachable_endpoint_until_shortly_before_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 10-minute token and an endpoint that answers 503: asked at the renewal point (8 minutes in), again every
    RETRY_DELAY (20 s here), and given up once the next try would come within EXPIRY_MARGIN (40 s) of the expiry."""
    monkeypatch.setattr("spark_amqp.transport.renewal.RETRY_DELAY", 20.0)
    monkeypatch.setattr("spark_amqp.transport.renewal.EXPIRY_MARGIN", 40.0)

    async def scenario(clock: DrivenClock) -> tuple[list[float], list[AmqpProtocolError]]:
        with TokenServer(opaque, lifetime=600) as server:
            c = options("amqp://h/v", **server.options())
            assert c.oauth2 is not None
            first = tokens.fetch(c.oauth2, 5.0)
            failed: list[AmqpProtocolError] = []

            async def apply(token: Token) -> None:
                raise AssertionError("no token should have come")

            server.failing = True
            renewal = Renewal(asyncio.get_running_loop(), c, first, apply, failed.append, "test")
            renewal.start()
            asked_at: list[float] = []  # seconds into the token's life
            while renewal.next_at is not None:
                due = renewal.next_at
                clock.skip_to(due)
                await until(lambda: failed or renewal.next_at not in (None, due))  # noqa: B023
                asked_at.append(due - first.obtained_at)
            renewal.cancel()
            assert len(server.requests) == 1 + len(asked_at)  # the first token, then one request at each point
            return asked_at, failed

    asked_at, failed = run_in_driven_time(monkeypatch, scenario)
    # 560 s would be within 40 s of the expiry (600 s): the try at 540 s is the last.
    assert asked_at == pytest.approx([480.0, 500.0, 520.0, 540.0])
    assert len(failed) == 1 and isinstance(failed[0], TokenUnavailable)  # given up before expiry: the caller reconnects


def test_a_datetime_expiry_is_read_in_utc() -> None:
    at = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    assert tokens._epoch(at) == tokens._epoch(at.replace(tzinfo=None)) == at.timestamp()
    assert tokens._epoch(True) is None

"""OAuth 2 tokens: where they come from, one cache per process, and when a connection renews its token.

A token comes from a token endpoint (the client-credentials grant, RFC 6749 4.4) or from a function of
the user's (``oauth2.tokenProvider=package.module:function``, for identities with an SDK of their own:
AWS STS, Azure). Every connection of a process asks ``current``: connections opened or renewing at the
same time share one fetch. Fetching blocks (HTTP, the user's SDK): the clients call it on a thread of
their loop's executor, never on the loop.

A token's value never goes into a log line, an exception or a ``repr``; neither does the client secret.

The provider's contract: called with no arguments, it returns ``(token, expires_at)``: the token as a
``str`` and its expiry as an aware ``datetime`` (a naive one is taken as UTC) or as seconds since the
epoch. Azure's ``AccessToken`` (``credential.get_token(scope)``) is such a pair. It raises ``OSError``
(``ConnectionError``, ``TimeoutError``…) for a failure worth retrying; any other exception is final.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import importlib
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import TokenError, TokenUnavailable
from .auth_options import OAuth2Options

__all__ = ["Token", "current", "fetch", "renew_at"]

log = logging.getLogger("spark_amqp.tokens")

# A token endpoint that gives no expires_in and a token that is not a JWT: renew after this long.
UNKNOWN_LIFETIME = 300.0
# How much of what an endpoint says is shown in an error: enough for an OAuth error description.
_SHOWN = 200

# Seconds since the epoch, for when a token was obtained and whether it is due for renewal (``Renewal`` reads it
# too): one name to replace, so that tests move time instead of waiting for it.
clock: Callable[[], float] = time.time


@dataclass(frozen=True)
class Token:
    value: str = field(repr=False)
    expires_at: float  # seconds since the epoch
    obtained_at: float

    @property
    def lifetime(self) -> float:
        return self.expires_at - self.obtained_at


def renew_at(obtained_at: float, expires_at: float) -> float:
    """When a connection renews a token obtained at ``obtained_at`` (epoch seconds) that expires at ``expires_at``.

    At 80% of its lifetime or a minute before it expires, whichever is sooner, but not before half of its
    lifetime: a long token is renewed a minute ahead, with room for a slow endpoint and retries; a short
    one (under five minutes) is not renewed over and over, and still has a fifth of its life left. RabbitMQ
    over the stream protocol starts refusing a connection's requests about a second before its token
    expires, and closes an AMQP 0-9-1 connection at the second it expires."""
    lifetime = max(0.0, expires_at - obtained_at)
    return max(obtained_at + 0.5 * lifetime, min(obtained_at + 0.8 * lifetime, expires_at - 60.0))


_tokens: dict[OAuth2Options, Token] = {}
_locks: dict[OAuth2Options, threading.Lock] = {}
_guard = threading.Lock()


def current(oauth2: OAuth2Options, timeout: float, replacing: Token | None = None) -> Token:
    """A token to log in or renew with: this process's latest while it is not due for renewal and is not
    ``replacing`` (the one a connection renews); else a new one. One fetch at a time per token source."""
    with _guard:
        lock = _locks.setdefault(oauth2, threading.Lock())
    with lock:
        latest = _tokens.get(oauth2)
        fresh = latest is not None and clock() < renew_at(latest.obtained_at, latest.expires_at)
        if latest is not None and fresh and (replacing is None or latest.value != replacing.value):
            return latest
        token = fetch(oauth2, timeout)
        _tokens[oauth2] = token
        log.info("OAuth 2: a new token from %s, valid for %.0fs", oauth2.source, token.lifetime)
        return token


def fetch(oauth2: OAuth2Options, timeout: float) -> Token:
    """A new token, from the endpoint or the provider (blocks; ``timeout`` bounds an HTTP request)."""
    if oauth2.token_provider is not None:
        return _from_provider(oauth2.token_provider)
    return _client_credentials(oauth2, timeout)


# -- the client-credentials grant ----------------------------------------------------------------------


def _client_credentials(oauth2: OAuth2Options, timeout: float) -> Token:
    assert oauth2.token_endpoint is not None and oauth2.client_id is not None and oauth2.client_secret is not None
    form = {"grant_type": "client_credentials"}
    if oauth2.scope:
        form["scope"] = oauth2.scope
    # HTTP Basic with the form-encoded id and secret: the client authentication every server must take (RFC 6749 2.3.1).
    basic = f"{urllib.parse.quote(oauth2.client_id, safe='')}:{urllib.parse.quote(oauth2.client_secret, safe='')}"
    request = urllib.request.Request(
        oauth2.token_endpoint,
        data=urllib.parse.urlencode(form).encode("ascii"),
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
            "Authorization": "Basic " + base64.b64encode(basic.encode("utf-8")).decode("ascii"),
        },
        method="POST",
    )
    where = oauth2.source
    scrub = _scrubber(oauth2.client_secret)
    obtained = clock()
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=_https_context(oauth2)) as answer:
            body = answer.read(1_000_000)
    except urllib.error.HTTPError as err:
        said = scrub(_oauth_error(err))
        if err.code >= 500 or err.code == 429:
            raise TokenUnavailable(f"{where} failed to issue a token (HTTP {err.code}{said}); retrying") from None
        raise TokenError(
            f"{where} refused to issue a token for client '{oauth2.client_id}' (HTTP {err.code}{said}); check options "
            "oauth2.clientId, oauth2.clientSecret and oauth2.scope"
        ) from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, ssl.SSLError):
            raise TokenError(
                f"{where}: TLS failed ({scrub(str(reason))}); its certificate must be signed by a CA of the system's or tls.caFile"
            ) from None
        raise TokenUnavailable(f"cannot reach {where} for a token: {scrub(str(reason))}") from None
    try:
        answer_json = json.loads(body)
        value = answer_json["access_token"]
    except (ValueError, KeyError, TypeError):
        raise TokenError(f"{where} answered without an access_token: not an OAuth 2 token response") from None
    if not isinstance(value, str) or not value:
        raise TokenError(f"{where} answered with an access_token that is not a string")
    expires_in = answer_json.get("expires_in")
    if isinstance(expires_in, int | float | str) and not isinstance(expires_in, bool):
        try:
            return Token(value, obtained + float(expires_in), obtained)
        except ValueError:
            pass
    return Token(value, jwt_expiry(value) or obtained + UNKNOWN_LIFETIME, obtained)


def _https_context(oauth2: OAuth2Options) -> ssl.SSLContext | None:
    if not (oauth2.token_endpoint or "").startswith("https:"):
        return None
    context = ssl.create_default_context()
    if oauth2.ca_file:
        # The broker's CA may be a private one while the identity provider's is public: trust both.
        context.load_verify_locations(cafile=oauth2.ca_file)
    return context


def _oauth_error(err: urllib.error.HTTPError) -> str:
    """``: invalid_client (Bad client credentials)`` from an OAuth error answer (RFC 6749 5.2), else ``''``."""
    try:
        said = json.loads(err.read(10_000))
    except (ValueError, OSError):
        return ""
    if not isinstance(said, dict) or not said.get("error"):
        return ""
    description = f" ({str(said['error_description'])[:_SHOWN]})" if said.get("error_description") else ""
    return f": {str(said['error'])[:_SHOWN]}{description}"


def _scrubber(secret: str) -> Callable[[str], str]:
    """Whatever an endpoint or a library says is shown without the client secret, should it echo it."""
    return lambda text: text.replace(secret, "***") if secret else text


def jwt_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (not verified: only to know when to renew), or None."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


# -- a function of the user's ----------------------------------------------------------------------------


def _from_provider(spec: str) -> Token:
    provider = _load(spec)
    where = f"option 'oauth2.tokenProvider' ({spec})"
    obtained = clock()
    try:
        result = provider()
    except OSError as err:
        raise TokenUnavailable(f"{where} could not get a token: {type(err).__name__}: {err}") from None
    except Exception as err:
        raise TokenError(f"{where} failed to give a token: {type(err).__name__}: {err}") from None
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise TokenError(f"{where} must return (token, expires_at), got {type(result).__name__}")
    value, expiry = result
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str) or not value:
        raise TokenError(f"{where} must return the token as a non-empty str, got {type(value).__name__}")
    expires_at = _epoch(expiry)
    if expires_at is None:
        raise TokenError(f"{where} must return the expiry as a datetime or seconds since the epoch, got {type(expiry).__name__}")
    if expires_at <= obtained:
        raise TokenError(f"{where} returned a token that expired {obtained - expires_at:.0f}s ago")
    return Token(value, expires_at, obtained)


def _load(spec: str) -> Callable[[], Any]:
    """The function ``package.module:function`` names, imported on first use (on the executors too)."""
    module_name, _, attribute = spec.partition(":")
    where = f"option 'oauth2.tokenProvider' ({spec})"
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or whatever importing the module raised
        raise TokenError(
            f"{where}: cannot import module '{module_name}' ({type(err).__name__}: {err}); it must be importable where Spark "
            "runs Python, on the driver and on the executors"
        ) from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise TokenError(f"{where}: module '{module_name}' has no '{attribute}'") from None
    if not callable(target):
        raise TokenError(f"{where}: '{attribute}' is a {type(target).__name__}, not a function")
    return target  # type: ignore[no-any-return]


def _epoch(expiry: object) -> float | None:
    if isinstance(expiry, datetime.datetime):
        if expiry.tzinfo is None:
            expiry = expiry.replace(tzinfo=datetime.UTC)
        return expiry.timestamp()
    if isinstance(expiry, int | float) and not isinstance(expiry, bool):
        return float(expiry)
    return None

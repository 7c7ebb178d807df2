"""The login both clients make, and the renewal of a connection's OAuth 2 token.

SASL ``PLAIN`` carries a password or an OAuth 2 token; ``EXTERNAL`` (an empty response) lets the broker
take the user from the client certificate. ``Login`` says what to send, what it means when the broker
does not offer the mechanism or refuses it, and holds the connection's token.

``Renewal`` keeps a token-logged-in connection open past its token's expiry, on the connection's own
loop: at ``tokens.renew_at`` it gets a token (the process's latest, or a new one) and hands it to the
broker through the client (``connection.update-secret`` over AMQP 0-9-1, a second ``SaslAuthenticate``
over the stream protocol). A refused token ends the connection with a ``TokenError``; a token endpoint
that cannot be reached is asked again until shortly before the token expires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .. import tokens
from ..auth_options import certificate_subject
from ..errors import AmqpProtocolError, LoginRefused, TokenError, TokenUnavailable, is_transient
from ..options import ConnectionOptions
from ..tokens import Token

__all__ = ["Login", "Renewal"]

log = logging.getLogger("spark_amqp.client")

# Retrying a token endpoint that could not be reached: at most this often, and given up this long
# before the token expires (then the connection ends with the endpoint's error, and reconnects).
RETRY_DELAY = 5.0
EXPIRY_MARGIN = 2.0


@dataclass(frozen=True)
class Login:
    options: ConnectionOptions
    token: Token | None = None  # with OAuth 2: the token this connection logs in with

    @classmethod
    async def prepare(cls, options: ConnectionOptions) -> Login:
        """The login for a new connection; with OAuth 2 a token, fetched off the loop (it blocks)."""
        if options.oauth2 is None:
            return cls(options)
        loop = asyncio.get_running_loop()
        token = await loop.run_in_executor(None, tokens.current, options.oauth2, options.connection_timeout, None)
        return cls(options, token)

    @property
    def mechanism(self) -> str:
        return self.options.mechanism

    def response(self, token: Token | None = None) -> str:
        """The SASL response: empty for EXTERNAL (the broker reads the certificate), else PLAIN's."""
        if self.mechanism == "EXTERNAL":
            return ""
        token = token or self.token
        secret = token.value if token is not None else self.options.password
        return f"\0{self.options.username}\0{secret}"

    def not_offered(self, offered: list[str]) -> LoginRefused | None:
        """The refusal to log in when the broker does not offer our mechanism (else None): never another one."""
        if self.mechanism in offered:
            return None
        said = ", ".join(offered) or "none"
        if self.mechanism == "EXTERNAL":
            return LoginRefused(
                f"the broker offers the SASL mechanisms {said}, not EXTERNAL (a login by client certificate): enable the "
                "plugin rabbitmq_auth_mechanism_ssl and add EXTERNAL to its auth_mechanisms, or log in with a password "
                "(option 'password')"
            )
        return LoginRefused(
            f"the broker offers the SASL mechanisms {said}, not PLAIN (a login by password or token)"
            + ("; to log in with the client certificate, leave option 'password' out" if "EXTERNAL" in offered else "")
        )

    def refused(self, err: AmqpProtocolError) -> AmqpProtocolError:
        """What the broker's refusal of our login means; a refused password stays as the broker said it."""
        options = self.options
        if options.oauth2 is not None:
            return TokenError(
                f"the broker refused the OAuth 2 token from {options.oauth2.source} as the password of user "
                f"'{options.username}' ({err}); check the token's audience (the broker's resource_server_id), its scopes "
                f"(e.g. rabbitmq.read:*/*) and that the broker trusts its signing key"
            )
        if self.mechanism == "EXTERNAL":
            tls = options.tls
            cert = tls.cert_file if tls is not None and tls.cert_file else ""
            subject = certificate_subject(cert) or "its subject"
            return LoginRefused(
                f"the broker refused the login by client certificate (SASL EXTERNAL) of {subject}, from 'tls.certFile' "
                f"({cert}) ({err}); the broker must have a user named after the certificate (ssl_cert_login_from: its "
                f"common name or its whole subject) that may use vhost '{options.vhost}'"
            )
        return err


class Renewal:
    """Renews one connection's token before it expires. ``apply`` gives the broker the new token;
    ``fail`` ends the connection. Runs on ``loop``, started once the connection is open."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        options: ConnectionOptions,
        token: Token,
        apply: Callable[[Token], Awaitable[None]],
        fail: Callable[[AmqpProtocolError], None],
        name: str,
    ) -> None:
        assert options.oauth2 is not None
        self.loop = loop
        self.options = options
        self.token = token
        self.renewals = 0  # how many times this connection renewed its token
        self._apply = apply
        self._fail = fail
        self._name = name
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._at(tokens.renew_at(self.token.obtained_at, self.token.expires_at))

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def _at(self, when: float) -> None:
        self._timer = self.loop.call_later(max(0.0, when - time.time()), self._fire)

    def _fire(self) -> None:
        self._task = self.loop.create_task(self._renew())

    async def _renew(self) -> None:
        oauth2 = self.options.oauth2
        assert oauth2 is not None
        try:
            token = await self.loop.run_in_executor(None, tokens.current, oauth2, self.options.connection_timeout, self.token)
            await self._apply(token)
        except AmqpProtocolError as err:
            if isinstance(err, TokenUnavailable) and time.time() + RETRY_DELAY < self.token.expires_at - EXPIRY_MARGIN:
                log.warning("AMQP: %s: renewing the OAuth 2 token: %s", self._name, err)
                self._at(time.time() + RETRY_DELAY)
            elif isinstance(err, TokenError) or not is_transient(err):
                self._fail(err)
            # else: the connection was lost meanwhile; its own reason stands
            return
        except Exception as err:  # the executor or a provider failing in a way tokens.py does not map
            self._fail(TokenError(f"renewing the OAuth 2 token from {oauth2.source} failed: {type(err).__name__}: {err}"))
            return
        self.token = token
        self.renewals += 1
        log.info("AMQP: %s: OAuth 2 token renewed, valid for %.0fs more", self._name, token.expires_at - time.time())
        self._at(tokens.renew_at(token.obtained_at, token.expires_at))

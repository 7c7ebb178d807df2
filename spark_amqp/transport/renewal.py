"""``Renewal`` keeps a token-logged-in connection open past its token's expiry, on the connection's own loop.

At ``tokens.renew_at`` it gets a token (the process's latest, or a new one) and hands it to the broker
through the client (``connection.update-secret`` over AMQP 0-9-1, a second ``SaslAuthenticate`` over the
stream protocol). A refused token ends the connection with a ``TokenError``; a token endpoint that cannot
be reached is asked again until shortly before the token expires.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..errors import AmqpProtocolError, TokenError, TokenUnavailable, is_transient
from . import tokens
from .options import ConnectionOptions
from .tokens import Token

__all__ = ["Renewal"]

log = logging.getLogger("spark_amqp.client")

# Retrying a token endpoint that could not be reached: at most this often, and given up this long
# before the token expires (then the connection ends with the endpoint's error, and reconnects).
RETRY_DELAY = 5.0
EXPIRY_MARGIN = 2.0


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
        self.next_at: float | None = None  # when the next attempt is due, by tokens.clock; None while one runs, and after the last
        self._apply = apply
        self._fail = fail
        self._name = name
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._at(tokens.renew_at(self.token.obtained_at, self.token.expires_at))

    def cancel(self) -> None:
        self.next_at = None
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def _at(self, when: float) -> None:
        self.next_at = when
        self._timer = self.loop.call_later(max(0.0, when - tokens.clock()), self._fire)

    def _fire(self) -> None:
        self.next_at = None
        self._task = self.loop.create_task(self._renew())

    async def _renew(self) -> None:
        oauth2 = self.options.oauth2
        assert oauth2 is not None
        try:
            token = await self.loop.run_in_executor(None, tokens.current, oauth2, self.options.connection_timeout, self.token)
            await self._apply(token)
        except AmqpProtocolError as err:
            if isinstance(err, TokenUnavailable) and tokens.clock() + RETRY_DELAY < self.token.expires_at - EXPIRY_MARGIN:
                log.warning("AMQP: %s: renewing the OAuth 2 token: %s", self._name, err)
                self._at(tokens.clock() + RETRY_DELAY)
            elif isinstance(err, TokenError) or not is_transient(err):
                self._fail(err)
            # else: the connection was lost meanwhile; its own reason stands
            return
        except Exception as err:  # the executor or a provider failing in a way tokens.py does not map
            self._fail(TokenError(f"renewing the OAuth 2 token from {oauth2.source} failed: {type(err).__name__}: {err}"))
            return
        self.token = token
        self.renewals += 1
        log.info("AMQP: %s: OAuth 2 token renewed, valid for %.0fs more", self._name, token.expires_at - tokens.clock())
        self._at(tokens.renew_at(token.obtained_at, token.expires_at))

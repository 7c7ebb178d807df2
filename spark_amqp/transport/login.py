"""The login every protocol's client makes (SASL).

SASL ``PLAIN`` carries a password or an OAuth 2 token; ``EXTERNAL`` (an empty response) lets the broker
take the user from the client certificate. ``Login`` says what to send, what it means when the broker
does not offer the mechanism or refuses it, and holds the connection's token (``renewal.py`` renews it).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..errors import AmqpProtocolError, LoginRefused, TokenError
from . import tokens
from .certificates import certificate_subject
from .options import ConnectionOptions
from .tokens import Token

__all__ = ["Login"]


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
        """The SASL response: empty for EXTERNAL (the broker reads the certificate) and ANONYMOUS, else PLAIN's."""
        if self.mechanism in ("EXTERNAL", "ANONYMOUS"):
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
        if self.mechanism == "ANONYMOUS":
            return LoginRefused(
                f"the broker offers the SASL mechanisms {said}, not ANONYMOUS (a login without credentials): RabbitMQ 4 offers "
                "it while anonymous_login_user is set; log in with a password instead (leave authMechanism out)"
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

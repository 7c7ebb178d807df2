"""A token provider as a user would write one (``oauth2.tokenProvider=tests.auth.provider:tls_node_token``):
no arguments, returns (token, expiry). Its tokens are for the TLS node and short-lived, to be renewed often."""

from __future__ import annotations

import datetime
import os

from .helpers import signer

LIFETIME = 5.0
calls = 0


def tls_node_token() -> tuple[str, datetime.datetime]:
    global calls
    calls += 1
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=LIFETIME)
    return signer(os.environ["AMQP_TEST_TLS_DIR"])(LIFETIME), expires

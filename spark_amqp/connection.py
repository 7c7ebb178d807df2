"""The TLS context for ``amqps://`` connections, from ``ConnectionOptions``."""

from __future__ import annotations

import ssl

from .options import ConnectionOptions

__all__ = ["tls_context"]


def tls_context(options: ConnectionOptions) -> ssl.SSLContext | None:
    tls = options.tls
    if tls is None:
        return None
    context = ssl.create_default_context(cafile=tls.ca_file)
    context.check_hostname = tls.check_hostname
    if not tls.check_hostname and tls.ca_file is None:
        context.verify_mode = ssl.CERT_NONE  # no CA and no name check: encryption only, as asked
    if tls.cert_file and tls.key_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context

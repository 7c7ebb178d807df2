"""pika connection parameters from ``ConnectionOptions`` (TLS included)."""

from __future__ import annotations

import ssl

import pika

from .options import ConnectionOptions

__all__ = ["pika_parameters"]


def pika_parameters(options: ConnectionOptions, client_name: str) -> pika.ConnectionParameters:
    ssl_options = None
    if options.tls is not None:
        context = ssl.create_default_context(cafile=options.tls.ca_file)
        context.check_hostname = options.tls.check_hostname
        if not options.tls.check_hostname:
            context.verify_mode = ssl.CERT_NONE if options.tls.ca_file is None else ssl.CERT_REQUIRED
        if options.tls.cert_file and options.tls.key_file:
            context.load_cert_chain(options.tls.cert_file, options.tls.key_file)
        ssl_options = pika.SSLOptions(context, server_hostname=options.host)
    return pika.ConnectionParameters(
        host=options.host,
        port=options.port,
        virtual_host=options.vhost,
        credentials=pika.PlainCredentials(options.username, options.password),
        heartbeat=options.heartbeat,
        socket_timeout=options.connection_timeout,
        stack_timeout=options.connection_timeout,
        blocked_connection_timeout=None,
        connection_attempts=1,
        ssl_options=ssl_options,
        client_properties={"connection_name": client_name, "product": "spark-amqp"},
    )

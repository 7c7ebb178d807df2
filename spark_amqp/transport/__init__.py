"""What every protocol's client stands on, below any reading mode or the sink.

``options`` (the connection's options: the uri and its endpoints, TLS, the login), ``endpoints`` (a
uri's host list and the shuffled order a connection walks it in), ``dial`` (the walk), ``tls`` (the
context, what a TLS failure means), ``auth_options`` and ``certificates`` (TLS and login options, a
certificate's subject), ``login`` (SASL PLAIN and EXTERNAL), ``tokens`` (OAuth 2 token sources, one
cache per process), ``renewal`` (a connection's token renewed before it expires), ``connection`` (the
base of every protocol's client connection: connect, heartbeats, renewal, one way to end), ``backoff``
and ``outage`` (how a retry loop waits, and when waiting becomes a failure).
"""

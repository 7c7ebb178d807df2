"""How long stream mode's questions to the broker wait before silence means something, shared by the AMQP 0-9-1
probes, the stream-protocol probes and the check for compressed sub-entries."""

from __future__ import annotations

__all__ = ["CHECK_AFTER", "EMPTY_WAIT", "UNCHECKED_WAIT"]

# How long a stream whose message count reads 0 is given to send its first delivery.
EMPTY_WAIT = 1.0
# How long an AMQP 0-9-1 read waits for what the stream holds before it asks whether a compressed sub-entry is
# there (compressed.py: the check costs a connection, then a one-chunk subscription).
CHECK_AFTER = 1.0
# How long a probe that got nothing from a stream that counts messages waits on for a slow broker once the stream
# protocol cannot be asked why, before it gives up (a question a running query asks again: an outage, waited out).
UNCHECKED_WAIT = 5.0

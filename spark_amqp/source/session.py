"""``ConsumerSession``: the source runner's one connection, on a background I/O thread.

One channel per queue, manual acks, a per-consumer prefetch. The I/O thread
owns pika; the runner thread talks to it only through ``inbox`` (deliveries and
events, in order) and ``ack`` (scheduled onto the I/O loop). A channel or
connection that dies is reopened with backoff under a new session id, so a
delivery tag is only ever acknowledged on the channel that delivered it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, NamedTuple

import pika
import pika.exceptions

from ..connection import pika_parameters
from ..errors import AmqpSourceError, reply_name
from ..options import SourceOptions

log = logging.getLogger("spark_amqp.source")


class Delivery(NamedTuple):
    """A message as the I/O thread hands it over, with the channel session it came on."""

    session: str
    queue: str
    tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    props: Any  # pika.BasicProperties
    body: bytes


class SessionClosed(NamedTuple):
    session: str
    queue: str
    reason: str


class AckConfirmed(NamedTuple):
    """The broker processed every ack up to ``tag`` on ``session`` (a later sync reply proved it)."""

    session: str
    tag: int


MIN_BACKOFF = 0.2
MAX_BACKOFF = 10.0
FATAL_CHANNEL_CODES = {403: "access refused", 404: "not found", 405: "locked by an exclusive consumer or owner"}


class ConsumerSession:
    def __init__(self, options: SourceOptions, run_id: str) -> None:
        self.options = options
        self.run_id = run_id
        self.inbox: deque[Delivery | SessionClosed | AckConfirmed] = deque()
        self.fatal: AmqpSourceError | None = None
        self._epoch = 0
        self._stopping = False
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: pika.SelectConnection | None = None
        self._channels: dict[str, Any] = {}  # session id -> open pika channel
        self._consuming: set[str] = set()  # queues with an active consumer
        self._backoff = MIN_BACKOFF
        self._ever_connected = False
        self._last_error = ""

    # -- runner-thread API ------------------------------------------------

    def start(self) -> None:
        """Connect and start consuming every queue; raise a clear error if that cannot work."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="amqp-source-io", daemon=True)
            self._thread.start()
        timeout = self.options.connection.connection_timeout + 5
        if not self._started.wait(timeout):
            self.check()
            raise AmqpSourceError(
                f"could not start consuming {', '.join(self.options.queues)} from "
                f"{self.options.connection.display_uri} within {timeout:.0f}s: {self._last_error or 'no answer'}"
            )
        self.check()

    def check(self) -> None:
        if self.fatal is not None:
            raise self.fatal

    def ack(self, session: str, tag: int) -> None:
        """Multi-ack up to ``tag`` on ``session``'s channel, if that channel is still alive."""
        conn = self._conn
        if conn is not None:
            conn.ioloop.add_callback_threadsafe(lambda: self._ack(session, tag))

    def pause(self, timeout: float = 10.0) -> None:
        """Cancel every consumer and wait for the broker's cancel-ok: after this, nothing more arrives."""
        self._run_on_loop(self._cancel_all, timeout)

    def resume(self, timeout: float = 10.0) -> None:
        self._run_on_loop(self._consume_all, timeout)

    def _run_on_loop(self, action: Any, timeout: float) -> None:
        conn = self._conn
        if conn is None:
            return
        done = threading.Event()
        conn.ioloop.add_callback_threadsafe(lambda: action(done.set))
        if not done.wait(timeout):
            raise AmqpSourceError(f"the broker did not answer within {timeout:.0f}s while pausing/resuming consumers")

    def _cancel_all(self, finished: Any) -> None:
        channels = [ch for ch in self._channels.values() if ch.is_open]
        remaining = [len(channels)]
        if not channels:
            finished()

        def one_done(_: Any) -> None:
            remaining[0] -= 1
            if remaining[0] == 0:
                finished()

        for ch in channels:
            ch.basic_cancel(ch.amqp_consumer_tag, callback=one_done)

    def _consume_all(self, finished: Any) -> None:
        for ch in self._channels.values():
            if ch.is_open:
                ch.amqp_consumer_tag = ch.basic_consume(ch.amqp_queue, ch.amqp_on_message, auto_ack=False)
        finished()

    def stop(self, timeout: float = 5.0) -> None:
        """Close channels cleanly so unacked deliveries go back to their queues at once."""
        self._stopping = True
        conn = self._conn
        if conn is not None:
            try:
                conn.ioloop.add_callback_threadsafe(self._close_connection)
            except Exception:  # the loop may already be gone
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    # -- I/O thread ---------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping and self.fatal is None:
            self._connect_once()
            if self._stopping or self.fatal is not None:
                break
            time.sleep(self._backoff)
            self._backoff = min(MAX_BACKOFF, self._backoff * 2)
        self._started.set()  # unblock a waiting start(); check() reports why

    def _connect_once(self) -> None:
        params = pika_parameters(self.options.connection, f"spark-amqp source {self.run_id}")
        conn = pika.SelectConnection(
            params,
            on_open_callback=self._on_connection_open,
            on_open_error_callback=self._on_connection_error,
            on_close_callback=self._on_connection_closed,
        )
        self._conn = conn
        conn.ioloop.start()
        self._conn = None

    def _on_connection_error(self, conn: pika.SelectConnection, error: BaseException) -> None:
        self._last_error = _describe(error)
        if isinstance(error, (pika.exceptions.ProbableAuthenticationError, pika.exceptions.AuthenticationError)) or (
            isinstance(error, pika.exceptions.ConnectionClosedByBroker) and error.reply_code in (403, 530)
        ):
            self.fatal = AmqpSourceError(
                f"the broker refused the login of user '{self.options.connection.username}' on "
                f"{self.options.connection.display_uri} (check the uri's user and the 'password' option)"
            )
        elif not self._ever_connected and isinstance(error, pika.exceptions.IncompatibleProtocolError):
            self.fatal = AmqpSourceError(f"{self.options.connection.display_uri} does not speak AMQP 0-9-1")
        else:
            log.warning("AMQP source: cannot connect to %s (%s); retrying", self.options.connection.display_uri, self._last_error)
        conn.ioloop.stop()

    def _on_connection_open(self, conn: pika.SelectConnection) -> None:
        self._ever_connected = True
        self._backoff = MIN_BACKOFF
        for queue in self.options.queues:
            self._open_channel(queue)

    def _on_connection_closed(self, conn: pika.SelectConnection, reason: BaseException) -> None:
        for session, channel in list(self._channels.items()):
            self._session_lost(session, channel.amqp_queue, f"connection lost: {_describe(reason)}")
        if not self._stopping:
            log.warning("AMQP source: connection to %s lost (%s); reconnecting", self.options.connection.display_uri, _describe(reason))
        conn.ioloop.stop()

    def _open_channel(self, queue: str) -> None:
        conn = self._conn
        if conn is None or not conn.is_open or self._stopping:
            return
        self._epoch += 1
        session = f"{self.run_id}.{self._epoch}"

        def on_open(channel: Any) -> None:
            channel.amqp_queue = queue
            channel.amqp_session = session
            self._channels[session] = channel
            channel.add_on_close_callback(lambda ch, reason: self._on_channel_closed(session, queue, reason))
            channel.add_on_cancel_callback(lambda frame: self._on_server_cancel(session, queue, channel))
            self._declare(channel, queue, lambda: self._qos(channel, session, queue))

        conn.channel(on_open_callback=on_open)

    def _declare(self, channel: Any, queue: str, then: Any) -> None:
        decl = self.options.declaration
        if decl is None:
            then()
            return

        def bind(_: Any) -> None:
            if decl.exchange:
                channel.queue_bind(queue, decl.exchange, routing_key=decl.binding_key, callback=lambda _: then())
            else:
                then()

        channel.queue_declare(queue, durable=decl.durable, arguments=decl.arguments or None, callback=bind)

    def _qos(self, channel: Any, session: str, queue: str) -> None:
        def consume(_: Any) -> None:
            inbox = self.inbox

            def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
                inbox.append(
                    Delivery(session, queue, method.delivery_tag, method.redelivered, method.exchange, method.routing_key, props, body)
                )

            channel.amqp_on_message = on_message
            channel.amqp_consumer_tag = channel.basic_consume(
                queue, on_message, auto_ack=False, callback=lambda _: self._now_consuming(queue)
            )

        channel.basic_qos(prefetch_count=self.options.prefetch, callback=consume)

    def _now_consuming(self, queue: str) -> None:
        self._consuming.add(queue)
        if self._consuming >= set(self.options.queues):
            self._started.set()

    def _on_channel_closed(self, session: str, queue: str, reason: BaseException) -> None:
        self._session_lost(session, queue, _describe(reason))
        if self._stopping:
            return
        code = getattr(reason, "reply_code", 0)
        if code in FATAL_CHANNEL_CODES:
            what = FATAL_CHANNEL_CODES[code]
            self.fatal = AmqpSourceError(
                f"queue '{queue}' on {self.options.connection.display_uri}: {what} ({code} {reply_name(code)}: {getattr(reason, 'reply_text', '')})"
            )
            self._close_connection()
            return
        if code == 406 and "timed out" in str(getattr(reason, "reply_text", "")):
            log.warning(
                "AMQP source: RabbitMQ's consumer_timeout closed the channel of queue '%s' (%s). Deliveries stay "
                "unacknowledged until the batch holding them is committed; a trigger interval or batch duration "
                "longer than consumer_timeout causes this. Nothing is lost (they are redelivered and recognised), "
                "but raise consumer_timeout or shorten the trigger interval.",
                queue,
                getattr(reason, "reply_text", ""),
            )
        else:
            log.warning("AMQP source: channel for queue '%s' closed (%s); reopening", queue, _describe(reason))
        conn = self._conn
        if conn is not None and conn.is_open:
            conn.ioloop.call_later(MIN_BACKOFF, lambda: self._open_channel(queue))

    def _on_server_cancel(self, session: str, queue: str, channel: Any) -> None:
        # The queue was deleted (or failed over): close this channel; reopening
        # it re-subscribes, or reports the queue as missing.
        log.warning("AMQP source: the broker cancelled the consumer of queue '%s'", queue)
        if channel.is_open:
            channel.close()

    def _session_lost(self, session: str, queue: str, reason: str) -> None:
        if self._channels.pop(session, None) is not None:
            self._consuming.discard(queue)
            self.inbox.append(SessionClosed(session, queue, reason))

    def _ack(self, session: str, tag: int) -> None:
        channel = self._channels.get(session)
        if channel is None or not channel.is_open:
            return
        channel.basic_ack(tag, multiple=True)
        # basic.qos is synchronous: its reply proves the ack before it was processed.
        channel.basic_qos(prefetch_count=self.options.prefetch, callback=lambda _: self.inbox.append(AckConfirmed(session, tag)))

    def _close_connection(self) -> None:
        conn = self._conn
        if conn is None:
            return
        if conn.is_open:
            conn.close()
        elif not conn.is_closing:
            conn.ioloop.stop()


def _describe(error: BaseException) -> str:
    code = getattr(error, "reply_code", None)
    text = getattr(error, "reply_text", None)
    if code is not None:
        return f"{code} {text}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__

"""One AMQP channel: its methods, delivery tags, unacked deliveries and confirms."""

from __future__ import annotations

import base64
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from pamqp import commands

from spark_amqp import errors, framing

from . import codec
from .consumer import Consumer
from .declare import DeclareMethods
from .message import Message, sorted_headers
from .queue import QUORUM_DEFAULT_PREFETCH, Queue
from .settle import REQUEUE, RETURN, SettleMethods, Unacked
from .timeouts import timeout_argument
from .tx import Publish, Transaction, TxMethods

if TYPE_CHECKING:
    from .connection import BrokerConnection
    from .stream import StreamQueue

B = commands.Basic
Q = commands.Queue
X = commands.Exchange
T = commands.Tx


class Channel(DeclareMethods, SettleMethods, TxMethods):
    def __init__(self, connection: BrokerConnection, number: int) -> None:
        self.connection = connection
        self.vhost = connection.server.vhost
        self.number = number
        self.open = True
        self.consumers: dict[str, Consumer] = {}
        self.unacked: OrderedDict[int, Unacked] = OrderedDict()
        self.next_tag = 0
        self.consumer_prefetch = 0
        self.timed_out: set[int] = set()  # delivery tags the queue took back (a consumer timeout, redeliver_unacked)
        self.confirming = False
        self.tx: Transaction | None = None
        self.publish_seq = 0
        self.pending_confirms: list[tuple[int, bool]] = []
        self.last_queue = ""
        self._stream_writer: str | None = None
        # Publishers repeat the same exchange, routing key and properties; sharing
        # one object for each keeps a queued message near its payload size.
        self._shared: dict[object, object] = {}
        # publish being assembled: (exchange, routing_key, mandatory), header, body parts
        self._publish: tuple[str, str, bool] | None = None
        self._header: bytes | None = None
        self._body_size = 0
        self._body: list[bytes] = []
        self._received = 0
        self._handlers: dict[type, Callable[[Any], None]] = {
            B.Publish: self._on_publish,
            B.Ack: self._on_ack,
            B.Nack: self._on_nack,
            B.Reject: self._on_reject,
            B.Qos: self._on_qos,
            B.Consume: self._on_consume,
            B.Cancel: self._on_cancel,
            B.Get: self._on_get,
            B.Recover: self._on_recover,
            B.RecoverAsync: self._on_recover,
            commands.Confirm.Select: self._on_confirm_select,
            commands.Channel.Flow: self._on_flow,
            T.Select: self._on_tx_select,
            T.Commit: self._on_tx_commit,
            T.Rollback: self._on_tx_rollback,
            X.Declare: self._on_exchange_declare,
            X.Delete: self._on_exchange_delete,
            X.Bind: self._on_exchange_bind,
            X.Unbind: self._on_exchange_unbind,
            Q.Declare: self._on_queue_declare,
            Q.Bind: self._on_queue_bind,
            Q.Unbind: self._on_queue_unbind,
            Q.Purge: self._on_queue_purge,
            Q.Delete: self._on_queue_delete,
        }

    # -- frame entry points -------------------------------------------------

    def on_method(self, method: Any) -> None:
        if self._publish is not None:
            raise errors.UnexpectedFrame("expected content header for class 60, got non content header frame instead")
        handler = self._handlers.get(type(method))
        if handler is None:
            raise errors.NotImplemented_(f"{method.name} is not supported by the embedded broker")
        try:
            handler(method)
        except errors.AmqpReplyError as err:
            if not err.class_id:
                err.class_id, err.method_id = divmod(method.index, 0x10000)
            raise

    def on_header(self, payload: bytes) -> None:
        if self._publish is None or self._header is not None:
            raise errors.UnexpectedFrame("expected method frame, got non method frame instead")
        if len(payload) < 14 or payload[0:2] != b"\x00\x3c":
            raise errors.FrameError("malformed content header")
        self._header = self._share(payload)
        self._body_size = codec.header_body_size(payload)
        if self._body_size == 0:
            self._complete_publish()

    def on_body(self, payload: bytes) -> None:
        if self._header is None:
            raise errors.UnexpectedFrame("expected method frame, got non method frame instead")
        # RabbitMQ reads an oversized message whole before it refuses it; its bytes need not be kept.
        if self._body_size <= self.connection.server.max_message_size:
            self._body.append(payload)
        self._received += len(payload)
        if self._received >= self._body_size:
            if self._received > self._body_size:
                raise errors.FrameError("content body larger than the size in its header")
            self._complete_publish()

    # -- publishing -----------------------------------------------------------

    def _on_publish(self, method: B.Publish) -> None:
        if method.immediate:
            raise errors.NotImplemented_("immediate=true")
        self._publish = (self._share(method.exchange or ""), self._share(method.routing_key or ""), bool(method.mandatory))
        self._received = 0
        self._body = []

    def _share(self, value: Any) -> Any:
        shared = self._shared
        found = shared.get(value)
        if found is not None:
            return found
        if len(shared) >= 4096:
            shared.clear()
        shared[value] = value
        return value

    def _complete_publish(self) -> None:
        assert self._publish is not None and self._header is not None
        limit = self.connection.server.max_message_size
        if self._body_size > limit:
            self._publish, self._header, self._body = None, None, []
            raise errors.PreconditionFailed(f"message size {self._body_size} is larger than configured max size {limit}", 60, 40)
        exchange, routing_key, mandatory = self._publish
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        header = self._header
        self._publish, self._header, self._body = None, None, []
        seq = 0
        if self.confirming:
            self.publish_seq += 1
            seq = self.publish_seq
        message = Message(exchange, routing_key, sorted_headers(header), body)
        queues = self.vhost.route(exchange, message)
        if self.tx is not None:
            self.tx.publishes.append(Publish(queues, message, mandatory))
            return
        self.enqueue(queues, message, mandatory, seq)

    def enqueue(self, queues: list[Queue], message: Message, mandatory: bool, seq: int) -> None:
        """A routed publish reaches its queues (or is returned); ``seq`` > 0 is confirmed."""
        if self.connection.server.faults.take("nack_publishes"):
            if seq:
                self._confirm(seq, False)
            return
        accepted = True
        if not queues:
            if mandatory:
                self.connection.send_return(
                    self.number, 312, "NO_ROUTE", message.exchange, message.routing_key, message.header, message.body
                )
        else:
            now = self.connection.loop_time()
            for i, queue in enumerate(queues):
                copy = message if i == 0 else message.copy_for_queue()
                if queue.is_stream:
                    cast("StreamQueue", queue).publish(copy, now, self.stream_writer())
                elif not queue.publish(copy, now):
                    accepted = False
        if seq:
            self._confirm(seq, accepted)

    def stream_writer(self) -> str:
        """The id RabbitMQ's stream client writes this channel's publishes under, in the trailer of their
        chunks: the channel process' pid, '_-' and a GUID (base64url). A 4-digit pid, as on a fresh node,
        gives the id RabbitMQ's length (34 bytes), which is all a reader sees of it."""
        if self._stream_writer is None:
            guid = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
            self._stream_writer = f"<0.{1000 + self.number}.0>_-{guid}"
        return self._stream_writer

    def _confirm(self, seq: int, ack: bool) -> None:
        self.pending_confirms.append((seq, ack))
        self.connection.schedule_flush()

    def drain_confirms(self) -> list[bytes]:
        """Encode pending confirms, folding runs of acks into one multiple ack."""
        pending = self.pending_confirms
        if not pending or not self.open:
            pending.clear()
            return []
        self.pending_confirms = []
        frames: list[bytes] = []
        run_end = 0
        run_len = 0
        for seq, ack in pending:
            if ack:
                run_end = seq
                run_len += 1
                continue
            if run_len:
                frames.append(framing.confirm_method(self.number, run_end, run_len > 1, True))
                run_len = 0
            frames.append(framing.confirm_method(self.number, seq, False, False))
        if run_len:
            frames.append(framing.confirm_method(self.number, run_end, run_len > 1, True))
        return frames

    # -- delivering -----------------------------------------------------------

    def deliver(self, consumer: Consumer, queue: Queue, message: Message) -> None:
        self.next_tag += 1
        tag = self.next_tag
        conn = self.connection
        if not consumer.no_ack:
            self.unacked[tag] = Unacked(queue, message, consumer, conn.loop_time(), tag)
            consumer.unacked += 1
            queue.unacked += 1
        conn.write(codec.deliver_method(self.number, consumer.tag_wire, tag, message.redelivered, message.exchange, message.routing_key))
        conn.write_content(self.number, message.header, message.body)

    def _on_get(self, method: B.Get) -> None:
        queue = self._queue(method.queue)
        message = queue.get()
        if message is None:
            self.connection.send_method(self.number, B.GetEmpty())
            return
        self.next_tag += 1
        tag = self.next_tag
        if not method.no_ack:
            self.unacked[tag] = Unacked(queue, message, None, self.connection.loop_time(), tag)
            queue.unacked += 1
        self.connection.write(
            codec.get_ok_method(self.number, tag, message.redelivered, message.exchange, message.routing_key, len(queue.ready))
        )
        self.connection.write_content(self.number, message.header, message.body)

    # -- consumers ------------------------------------------------------------

    def _on_qos(self, method: B.Qos) -> None:
        if method.prefetch_size:
            raise errors.NotImplemented_(f"prefetch_size!=0 ({method.prefetch_size})")
        # RabbitMQ 4.3 denies the deprecated feature global_qos by default: a global
        # basic.qos is taken as a per-consumer one (3.10 and 4.0 limit the channel).
        self.consumer_prefetch = method.prefetch_count
        self.connection.send_method(self.number, B.QosOk())
        for consumer in self.consumers.values():
            consumer.queue.dispatch()

    def _on_consume(self, method: B.Consume) -> None:
        queue = self._queue(method.queue)
        tag = method.consumer_tag or "amq.ctag-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if tag in self.consumers:
            raise errors.NotAllowed(f"attempt to reuse consumer tag '{tag}'")
        prefetch = self.consumer_prefetch
        start = None
        if queue.is_stream and self.connection.server.faults.take("replica_down"):
            raise errors.PreconditionFailed(f"stream queue '{queue.name}' in vhost '/' {errors.NO_LOCAL_REPLICA}")
        if queue.is_stream:
            start = queue.check_consume(method.arguments or {}, bool(method.no_ack), prefetch)  # type: ignore[attr-defined]
        elif method.arguments and "x-stream-offset" in method.arguments:
            # RabbitMQ refuses it on other queue types: how a reader learns, before any
            # ack, that the queue is not a stream (where an ack would delete).
            kind = "rabbit_quorum_queue" if queue.is_quorum else "rabbit_classic_queue"
            raise errors.PreconditionFailed(f"invalid arg 'x-stream-offset' for queue '{queue.name}' in vhost '/' of queue type {kind}")
        elif queue.is_quorum:
            prefetch = prefetch or QUORUM_DEFAULT_PREFETCH
        consumer = Consumer(tag, self, queue, bool(method.no_ack), bool(method.exclusive), prefetch, timeout_argument(method.arguments))
        if start is not None:
            queue.add_consumer(consumer, start)  # type: ignore[call-arg]
        else:
            queue.add_consumer(consumer)
        self.consumers[tag] = consumer
        if not method.nowait:
            self.connection.send_method(self.number, B.ConsumeOk(consumer_tag=tag))
        queue.dispatch()

    def _on_cancel(self, method: B.Cancel) -> None:
        consumer = self.consumers.pop(method.consumer_tag or "", None)
        if not method.nowait:
            self.connection.send_method(self.number, B.CancelOk(consumer_tag=method.consumer_tag))
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)
            self.vhost.consumer_gone(consumer.queue)

    def time_out(self, consumer: Consumer, entries: list[Unacked]) -> None:
        """RabbitMQ 4.3's consumer timeout (see ``timeouts``): the deliveries go back, uncounted,
        their tags may still be acknowledged (to no effect), and the consumer is cancelled."""
        consumer.queue.remove_consumer(consumer)
        self.consumer_cancelled_by_server(consumer)
        for entry in entries:
            del self.unacked[entry.tag]
            self.timed_out.add(entry.tag)
        self.settle(entries, REQUEUE)
        self.vhost.consumer_gone(consumer.queue)

    def redeliver_unacked(self, queue: str) -> int:
        """What a quorum queue does when the node of a consumer it took for gone is back (its consumer-disconnected
        timeout ran out during a partition): the deliveries of ``queue`` not acknowledged go back, uncounted, and come
        again to the same consumers on this same channel, redelivered, under new tags; acking an old tag is accepted
        and does nothing. How many went back."""
        entries = [e for e in self.unacked.values() if e.queue.name == queue and e.consumer is not None]
        for entry in entries:
            del self.unacked[entry.tag]
            self.timed_out.add(entry.tag)
        self.settle(entries, REQUEUE)
        return len(entries)

    def consumer_cancelled_by_server(self, consumer: Consumer) -> None:
        self.consumers.pop(consumer.tag, None)
        if self.open and self.connection.client_capability("consumer_cancel_notify"):
            self.connection.send_method(self.number, B.Cancel(consumer_tag=consumer.tag, nowait=True))

    def _on_confirm_select(self, method: commands.Confirm.Select) -> None:
        if self.tx is not None:
            raise errors.PreconditionFailed("cannot switch from tx to confirm mode")
        self.confirming = True
        if not method.nowait:
            self.connection.send_method(self.number, commands.Confirm.SelectOk())

    def _on_flow(self, method: commands.Channel.Flow) -> None:
        if not method.active:
            raise errors.NotImplemented_("active=false")  # as RabbitMQ: it never stops a channel's deliveries
        self.connection.send_method(self.number, commands.Channel.FlowOk(active=True))

    # -- teardown ---------------------------------------------------------------

    def close(self) -> None:
        """Channel gone: cancel its consumers and requeue every unacked delivery."""
        if not self.open:
            return
        self.open = False
        self.pending_confirms.clear()
        for consumer in list(self.consumers.values()):
            consumer.queue.remove_consumer(consumer)
        consumers = list(self.consumers.values())
        self.consumers.clear()
        if self.tx is not None:
            self.tx.rollback(self)  # what the transaction held goes back unsettled, then is requeued
        self.settle(self._take(0, True), RETURN)
        for consumer in consumers:
            self.vhost.consumer_gone(consumer.queue)

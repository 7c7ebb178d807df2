"""Which partition of a super stream a row goes to: as RabbitMQ's Java stream client routes by default.

``HashRoutingStrategy`` of com.rabbitmq:stream-client (read in 1.11.0's bytecode, and run to make the
known values in tests/sink/test_routing.py): MurmurHash3 x86 32-bit of the key's UTF-8 bytes with seed
104729, and partition ``Integer.remainderUnsigned(hash, n)`` of the partitions in their order. Writing
the same keys here and with that client puts them on the same partitions, so a Java consumer with
single active consumer per partition sees the same partitioning. (rstream hashes the key's UTF-16
bytes instead, so its producers route differently.)
"""

from __future__ import annotations

import struct

__all__ = ["SEED", "murmur3_32", "partition_of"]

SEED = 104729
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_MASK = 0xFFFFFFFF
_BLOCKS = struct.Struct("<I")


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def murmur3_32(data: bytes, seed: int = SEED) -> int:
    """MurmurHash3 x86 32-bit, unsigned."""
    h = seed & _MASK
    tail_at = len(data) & ~3
    for (k,) in _BLOCKS.iter_unpack(data[:tail_at]):
        k = _rotl((k * _C1) & _MASK, 15) * _C2 & _MASK
        h = (_rotl(h ^ k, 13) * 5 + 0xE6546B64) & _MASK
    k = 0
    for i, byte in enumerate(data[tail_at:]):
        k |= byte << (8 * i)
    h ^= _rotl((k * _C1) & _MASK, 15) * _C2 & _MASK  # no tail: 0
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    return h ^ (h >> 16)


def partition_of(key: str, partitions: int) -> int:
    return murmur3_32(key.encode("utf-8")) % partitions

"""Which input partition a message belongs in: its routing key (the ordering key, else the message id)
hashed as Kafka's Java client hashes a key. Pure.

A message, its cancel and its replace carry the same routing key, and so do the messages of one
ordering key: they meet in one input partition, and so in the one cell that owns it, whatever Kafka
key each of them carries on to the output topic."""

from __future__ import annotations

import struct

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of `data` as a signed 32-bit integer: the Java client's `Utils.murmur2`, which
    librdkafka's `murmur2` and `murmur2_random` partitioners compute too."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for (k,) in struct.iter_unpack("<I", data[:whole]):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length - whole
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_of(key: bytes, partitions: int) -> int:
    """The partition of `partitions` that the Java client's default partitioner (and librdkafka's
    `murmur2_random`) gives a message with Kafka key `key`."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def routing_key(message_id: str, ordering_key: str | None) -> bytes:
    """The bytes a message is routed by: its ordering key when it has one, else its id (UTF-8)."""
    return (ordering_key if ordering_key is not None else message_id).encode()


def input_partition(message_id: str, ordering_key: str | None, partitions: int) -> int:
    """The input partition a message, its cancel and its replace go to, on an input topic of `partitions`."""
    return partition_of(routing_key(message_id, ordering_key), partitions)

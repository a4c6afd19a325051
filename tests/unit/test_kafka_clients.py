"""The confluent-kafka adapter at its boundary: the domain's error names are librdkafka's, and the
group consumer's lag reads the cached watermarks."""

from __future__ import annotations

import types

import pytest
from confluent_kafka import KafkaError, TopicPartition

from chronos.adapters.kafka.clients import GroupConsumer
from chronos.domain import delivery

NAMES = sorted(delivery.PERMANENT | delivery.TOPIC_REFUSALS | delivery.UNANSWERED | delivery.PRODUCER_STATE
               | {delivery.PARTITION_EOF})


@pytest.mark.parametrize("name", NAMES)
def test_every_error_name_the_domain_classifies_is_one_librdkafka_reports(name):
    assert KafkaError(getattr(KafkaError, name)).name() == name


class Assigned(GroupConsumer):
    """A group consumer whose assignment, positions and cached watermarks are given."""

    def assignment(self):
        return [TopicPartition("in", 0), TopicPartition("in", 1), TopicPartition("in", 2)]

    def position(self, partitions):
        return [TopicPartition(tp.topic, tp.partition, {0: 5, 1: 3, 2: -1001}[tp.partition]) for tp in partitions]

    def get_watermark_offsets(self, partition, timeout=None, cached=False):
        assert cached, "the lag gauge reads the cached watermarks, never asks the broker"
        return 0, {0: 12, 1: -1001, 2: 4}[partition.partition]


def test_the_ends_are_the_position_and_the_cached_high_watermark_negative_where_unknown():
    consumer = Assigned({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"})
    try:
        assert consumer.ends() == {0: (5, 12), 1: (3, -1), 2: (-1, 4)}
    finally:
        consumer.close()


def test_a_failure_made_by_chronos_reads_like_a_client_s():
    failure = delivery.Failure(delivery.PURGED_IN_FLIGHT, "no delivery report from a replaced producer")
    assert (failure.name(), failure.fatal()) == ("_PURGE_INFLIGHT", False)
    assert delivery.classify(failure) == delivery.UNANSWERED_FAILURE
    assert delivery.classify(types.SimpleNamespace(name=lambda: "UNKNOWN", fatal=lambda: True)) == \
        delivery.PRODUCER_FAILURE

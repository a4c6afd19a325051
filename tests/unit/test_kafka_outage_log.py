"""librdkafka reports a down broker or a refused TLS/SASL handshake at every reconnect attempt: the
processes log each once per outage, the refusal as an error that says what to check."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError

from chronos.adapters.kafka.clients import OutageLog


def test_a_refused_handshake_is_logged_once_per_outage(caplog):
    outage = OutageLog("firer")
    refused = KafkaError(KafkaError._SSL, "ssl://b:9093/bootstrap: SSL handshake failed: certificate verify failed")
    with caplog.at_level(logging.WARNING, logger="chronos.kafka"):
        outage.error(KafkaError(KafkaError._TRANSPORT, "connection closed"))
        for _ in range(20):
            outage.error(refused)
            outage.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
        outage.ok()
        outage.error(refused)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "ERROR", "WARNING", "ERROR"], lines
    assert lines[1][1].startswith("kafka refused the connection of the firer (ssl://b:9093/bootstrap: SSL handshake "
                                  "failed: certificate verify failed): check its TLS and SASL settings")
    assert lines[2][1].startswith("kafka reachable again for firer")

"""Embedded PostgreSQL and the embedded Kafka-compatible broker (Tansu) as child processes.

Used by `chronos up` (long-running, data directory kept across restarts) and by tests
(throwaway, `fast=True`). The caller owns the lifecycle: nothing here registers atexit hooks
or keeps global state; call `stop()` (or use the objects as context managers).

One module per service: `postgres.py` (`EmbeddedPostgres`), `broker.py` (`EmbeddedBroker`), and
`procs.py`, what both share: a server in its own process group, its log file, its local port.
Topic creation belongs to the Kafka adapter (`chronos.adapters.kafka.admin`).
"""

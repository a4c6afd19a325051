"""The benchmarks' harness: what the studies beside it share (the stacks they run on, and the fault and
fleet scenarios, are the test kits': the top-level package `kits`).

kafka_load.py (the load producer, output reader and broker probe, each a process of its own), records.py
(their per-message records), targets.py (the system under test: Chronos, pgqueuer, graphile-worker, with
pgq_target.py, graphile_target.py and graphile/), step.py (one step of load, measured), report.py (a
step's figures), samplers.py (the queue table's statistics and the embedded broker, sampled while a run
goes), database.py (the stack's PostgreSQL seen directly: far-future rows, table size), procstat.py (CPU
and memory per process), accounting.py (where each undelivered message is).
"""

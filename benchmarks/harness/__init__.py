"""The benchmarks' harness: what the studies beside it and the tests share.

stack.py (`chronos up` as a subprocess, a peer's own PostgreSQL, a stack run by somebody else),
kafka_load.py (the load producer, output reader and broker probe, each a process of its own), records.py
(their per-message records), targets.py (the system under test: Chronos, pgqueuer, graphile-worker, with
pgq_target.py, graphile_target.py and graphile/), step.py (one step of load, measured), report.py (a
step's figures and the one percentile definition), samplers.py (the queue table's statistics and the
embedded broker, sampled while a run goes), database.py (the stack's PostgreSQL seen directly: far-future
rows, table size), procstat.py (CPU and memory per process), accounting.py (where each undelivered message
is), faultload.py (the fault scenarios' load, reader and verdict).
"""

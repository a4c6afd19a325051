"""Chronos benchmarks: the SLA harness (`python -m benchmarks.sla`) and micro benchmarks (`make bench`).

Benchmark-only dependencies live in the `bench` extra (`pip install -e '.[bench]'`); nothing here
is imported by the service.
"""

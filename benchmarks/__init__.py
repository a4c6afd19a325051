"""Chronos benchmarks: the harness the studies and the tests share (benchmarks/harness/), the studies
beside it (`python -m benchmarks.<study>`, each behind a page of the documentation: README.md), and
the micro benchmarks (`make bench`).

Benchmark-only dependencies live in the `bench` extra (`pip install -e '.[bench]'`); nothing here
is imported by the service.
"""

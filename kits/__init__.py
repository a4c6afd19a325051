"""The test kits: the systems the tests and the benchmarks run Chronos in, and their verdicts.

    stack.py      `chronos up` as a subprocess (its embedded PostgreSQL and broker), a peer's own
                  PostgreSQL, a stack run by somebody else; `run_on`, a benchmark's start-run-stop
    traffic.py    a steady load on the input topic, a reader of the output topic, what is in flight
    verdicts.py   what was lost, early or twice (and which fault explains it), how late, when firing resumed
    faults.py     a stack under load and faults (tests/faults, tests/ha, the soak and HA benchmarks)
    fleet/        hosts as network namespaces: Chronos installed as the install page says, a Patroni
                  cluster, the broker, Prometheus with the shipped rules, and partitions under load
    network.py    hosts of their own on one machine (namespaces on a bridge) and real partitions
    proxy.py      a TCP proxy that freezes as a hung server does
    tls.py        certificate authorities and a TLS proxy for the broker; PostgreSQL 15 with TLS
    pgbouncer.py  Debian's PgBouncer in front of PostgreSQL
    podman.py     Chronos's container image (make image) run by podman, with this machine's settings
    figures.py    the one definition of a percentile

They import the product and nothing of the tests or the benchmarks, which import them.
"""

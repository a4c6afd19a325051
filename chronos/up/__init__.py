"""`chronos up`: the whole stack in the foreground on one machine.

PostgreSQL (embedded under the data directory unless a URL is given), a Kafka-compatible
broker (embedded unless bootstrap servers are given), topics, migrations, then supervisord
running the consumer, firer and detector programs of the project's supervisord.conf, and the
web console (unless --no-console or its extra is missing).

One `chronos up` per data directory (a lock file). Everything it starts dies with it, even when
it is killed outright, and the next one stops whatever an earlier killed one left behind (see
chronos.runtime.orphans). An embedded PostgreSQL that dies is started again on the same port (crash
recovery); the programs reconnect by themselves, and the memory-only broker keeps its messages. An
embedded broker that dies is started again on the same port with the topics recreated, and the
programs with it; it had its messages in memory only, and `chronos up` says how many input messages
not yet read were lost with it (from the offsets it samples every few seconds: chronos.embedded.watch).

command.py (its arguments, signals and exit code), stack.py (the start order, the watch, the stop, the
ready file), datadir.py (the data directory's lock and layout), supervisor.py (supervisord and its
XML-RPC client), programs.py (the programs' states), recovery.py (starting a dead embedded service again).
"""

# The layout's numbers, here so that `chronos --help` and the commands that start no stack load none of the
# modules that use them (chronos/commands/up.py's flags name them).
ROLES = ("consumer", "firer", "detector")
# Input partitions per cell, unless --partitions says: the map gives each cell its share of them, and the
# embedded broker cannot add partitions to a topic, so there is room up front for the cells a stack may grow to
# (a partition at least per cell).
PARTITIONS_PER_CELL = 4
# Partitions of the topics `chronos up` creates: one on the embedded broker, whose every fetch lists all the
# batches a partition holds, so fewer partitions mean fewer batches to list per fetch (measured:
# docs/operations/embedded-stack.md#why-it-slows-as-it-fills-and-what-chronos-does-about-it); four on a real
# Kafka, so several consumers share the input.
EMBEDDED_PARTITIONS, EXTERNAL_PARTITIONS = 1, 4

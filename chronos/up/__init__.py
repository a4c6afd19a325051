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

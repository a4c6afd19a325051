-- chronos: compatible from 8
-- chronos: outside a transaction
-- One index for the due rows where there were two: the due index (migration 2) and the firers' share index
-- (migration 9) each took an entry for every row written, and with them a B-tree insert and its WAL. This one
-- orders the rows as the due index did and carries each row's slice (chronos.domain.shares) as its last column,
-- so a firer's claim of its own slices is one range of it in deadline order, the slice read off the index
-- entry, and the claim of every slice the same range without that condition. It covers every row, not only
-- the unclaimed ones: the claims of 0.2.0's firers (which say `readied_at IS NULL AND cron IS NULL`, and
-- of slices `num_nulls(readied_at, cron) = 2`) read it either way, and a claimed row is deleted, so the few
-- rows it holds beyond the due ones are the recurring schedules and, with the claim that stamps, the rows in
-- flight. Built before the two go, so every claim has an index at each step.
CREATE INDEX CONCURRENTLY IF NOT EXISTS chronos_messages_due_sliced
    ON chronos_messages (deadline, seq, (hashtext(coalesce(ordering_key, id)) & 15));
DROP INDEX CONCURRENTLY IF EXISTS chronos_messages_due;
DROP INDEX CONCURRENTLY IF EXISTS chronos_messages_due_share;

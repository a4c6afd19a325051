-- chronos: compatible from 8
-- chronos: outside a transaction
-- Firers divide the due rows: each claims first from its own slices of them, and from the others'
-- only when its own are drained and theirs are overdue (chronos.domain.shares). A firer's lease is
-- its row here, renewed while it runs: the live firers are those seen within the hold time, and
-- each of them works out the same division from the same list.
CREATE TABLE IF NOT EXISTS chronos_firers (
    node     uuid PRIMARY KEY,
    seen_at  timestamptz NOT NULL
);
-- A firer's claim of its own slices reads only its own rows: one range of this index per slice.
-- The slice goes by the ordering key when there is one, so a key's rows are all in one slice and
-- one firer claims them in order. (The claim of every slice keeps the due index.) Its predicate
-- says what the due index's says (unclaimed, not a schedule) in words the planner cannot read as
-- the due index's: the claim of slices says it the same way, so the due index, whose predicate it
-- does not imply, is no plan for it. The planner would otherwise take the due index and filter by
-- slice whenever its statistics say few rows are due (a table analyzed before a burst).
CREATE INDEX CONCURRENTLY IF NOT EXISTS chronos_messages_due_share
    ON chronos_messages ((hashtext(coalesce(ordering_key, id)) & 15), deadline, seq)
    WHERE num_nulls(readied_at, cron) = 2;

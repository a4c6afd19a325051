-- Operators: search what waits (`chronos list`), act on it (cancel, fire-now, reschedule), count
-- those actions, and a daylight-saving policy for recurring schedules.

-- `chronosDstPolicy` of a recurring schedule (NULL: repeated local times fire at the first,
-- skipped ones are skipped).
ALTER TABLE chronos_messages ADD COLUMN dst_policy text;

-- Both cover unclaimed rows only (`readied_at IS NULL`): a firer's claim writes a new row version
-- that falls outside them, so it costs the claim nothing (in-flight rows are few and searched off
-- the in-flight index).
-- `chronos list --topic T` for a topic other than the output topic: only rows sent elsewhere
-- (chronosTopic) are in it, so it costs nothing to messages for the output topic.
CREATE INDEX chronos_messages_topic ON chronos_messages (topic, deadline, seq)
    WHERE topic IS NOT NULL AND readied_at IS NULL;
-- `chronos list --key K`: a hash index holds a 4-byte hash per row whatever the key's size (a
-- b-tree on the key itself would refuse keys over about 2.7 kB, and be as large as the keys).
CREATE INDEX chronos_messages_key ON chronos_messages USING hash (key)
    WHERE key IS NOT NULL AND readied_at IS NULL;
-- (`--id-prefix` uses the primary key, `--ordering-key` the ordering index, `--state` and the
-- deadline bounds the partial due, in-flight and schedule indexes.)

-- How many operator actions were taken and how many messages they changed, per action: the CLI
-- is a short-lived process, so it counts here, in the transaction of the change, and the
-- detector exports the totals as counters.
CREATE TABLE chronos_actions (
    action    text PRIMARY KEY,
    actions   bigint NOT NULL DEFAULT 0,
    messages  bigint NOT NULL DEFAULT 0,
    last_at   timestamptz
);

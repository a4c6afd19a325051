-- Ordering keys, cancel/replace and recurring (cron) schedules.

-- Enqueue order, to break ties between equal deadlines (ordering keys fire in this order).
ALTER TABLE chronos_messages ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY;
-- A row with a cron expression is a recurring schedule: `deadline` is its next occurrence.
ALTER TABLE chronos_messages ADD COLUMN cron text;
ALTER TABLE chronos_messages ADD COLUMN timezone text;

DROP INDEX chronos_messages_due;
CREATE INDEX chronos_messages_due ON chronos_messages (deadline, seq) WHERE readied_at IS NULL AND cron IS NULL;
CREATE INDEX chronos_messages_schedules ON chronos_messages (deadline) WHERE cron IS NOT NULL;
CREATE INDEX chronos_messages_ordering ON chronos_messages (ordering_key, deadline, seq)
    WHERE ordering_key IS NOT NULL;

-- The store: one row per waiting or in-flight message.
CREATE TABLE chronos_messages (
    id            text PRIMARY KEY,
    deadline      timestamptz NOT NULL,
    readied_at    timestamptz,
    readied_by    uuid,
    topic         text,          -- destination when overridden by chronosTopic; NULL = output topic
    key           bytea,
    value         bytea,
    headers       bytea,         -- encoded by chronos.codec.encode_headers
    ordering_key  text,
    enqueued_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((readied_at IS NULL) = (readied_by IS NULL))
) WITH (fillfactor = 80);

-- Due rows in deadline order; far-future rows sit at the end and cost the claim nothing.
CREATE INDEX chronos_messages_due ON chronos_messages (deadline) WHERE readied_at IS NULL;
-- In-flight rows, for the detector and status.
CREATE INDEX chronos_messages_readied ON chronos_messages (readied_at) WHERE readied_at IS NOT NULL;

-- A churning queue table: vacuum it early and often.
ALTER TABLE chronos_messages SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);

-- Publish failures: per-row retry with backoff, and a place for messages no topic accepts.

-- Failed publishes of this row so far, and the last error (for operators).
ALTER TABLE chronos_messages ADD COLUMN attempts integer NOT NULL DEFAULT 0;
ALTER TABLE chronos_messages ADD COLUMN last_error text;
-- The deadline as scheduled, kept when a retry's backoff moves `deadline` later: lateness, the
-- dead letter and the ordering of a key go by it. NULL until the first retry.
ALTER TABLE chronos_messages ADD COLUMN original_deadline timestamptz;
-- The claim's ordering check looks up a key's retried rows by the deadline as scheduled (few rows).
CREATE INDEX chronos_messages_ordering_retried ON chronos_messages (ordering_key, original_deadline, seq)
    WHERE original_deadline IS NOT NULL AND ordering_key IS NOT NULL;

-- Messages that neither their destination nor the dead-letter topic accepted (too large for
-- both, say): kept here for an operator, never dropped.
CREATE TABLE chronos_parked (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id    text,          -- NULL when the message had no usable id
    source        text NOT NULL, -- `store/<id>`, or `<topic>/<partition>/<offset>` of the input
    topic         text NOT NULL, -- where it was going
    deadline      timestamptz,
    key           bytea,
    value         bytea,
    headers       bytea,         -- encoded by chronos.codec.encode_headers
    reason        text NOT NULL, -- `<reason>: <detail>`, as chronosError would have said
    parked_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX chronos_parked_parked_at ON chronos_parked (parked_at);

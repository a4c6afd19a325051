-- Fire-rate limits: one token bucket per limited destination topic, shared by every firer.
-- A firer takes tokens under the row's lock, in the transaction that claims that many rows, so
-- the firers together never publish to a topic faster than its rate (plus one bucketful).
CREATE TABLE chronos_rate_limits (
    topic        text PRIMARY KEY,       -- the destination topic by name (the output topic too)
    rate         float8 NOT NULL,        -- messages per second, as the firers last applied it
    tokens       float8 NOT NULL,        -- messages that may be claimed now
    refilled_at  timestamptz NOT NULL    -- database clock of the last refill
);
-- `chronos status` and the detector's gauges read the limited topics from here, so they show what
-- the firers enforce without being given the limits themselves.

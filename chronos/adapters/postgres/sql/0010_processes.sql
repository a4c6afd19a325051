-- chronos: compatible from 8
-- Where each process serves /metrics, so that the console and `chronos status` find every process of
-- every host with no list of addresses to keep: a process says so when it starts serving, again every
-- 30 seconds, and takes its row away when it stops; a row not renewed for a day is dropped by the
-- next process that renews its own.
CREATE TABLE IF NOT EXISTS chronos_processes (
    node         uuid PRIMARY KEY,
    role         text NOT NULL,
    metrics_url  text NOT NULL,
    seen_at      timestamptz NOT NULL
);

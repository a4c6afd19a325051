-- chronos: compatible from 8
-- With cells: which cells each consumer of a group reaches, as it says in every cell it reaches, about once a
-- second (a row per consumer and cell it reached, with when it last did). A consumer cut off from a cell reads
-- here, in the cells it still reaches, whether another consumer of its group has reached that cell since: only
-- then is it alone cut off from it, and it leaves its group so that the other takes the cell's partitions. Rows
-- not renewed for a day are dropped by the next consumer that speaks.
CREATE TABLE IF NOT EXISTS chronos_consumer_reach (
    consumer_group  text NOT NULL,
    node            uuid NOT NULL,
    cell            text NOT NULL,
    reached_at      timestamptz NOT NULL,
    PRIMARY KEY (consumer_group, node, cell)
);

-- chronos: compatible from 8
-- Moves of input partitions between cells (`chronos cells move`, chronos/ops/moves.py). A move is kept in the
-- database of the cell the partition leaves: its step, how far its copy has read, and its lease (the command
-- that runs it renews it; another one takes the move over once it has expired), so that run again after it died
-- half way it finishes the job.
CREATE TABLE IF NOT EXISTS chronos_cell_moves (
    partition   integer PRIMARY KEY CHECK (partition >= 0),
    target      text NOT NULL,                   -- the cell it goes to, by its name in CHRONOS_CELLS
    step        text NOT NULL CHECK (step IN ('copying', 'cutting-over', 'finishing')),
    cursor      bigint NOT NULL DEFAULT 0,       -- the copy's next heap block
    horizon     timestamptz NOT NULL,            -- rows due after it are copied ahead; the rest at the cut-over
    node        uuid NOT NULL,                   -- the lease: who runs it, renewed at seen_at
    seen_at     timestamptz NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now()
);

-- While a partition moves, the ids of its rows written since the move began (inserted, changed or deleted by
-- anyone: consumers, firers, operators), each with the number of its last change: the move carries each
-- over as it stands, and forgets an id only if it did not change again meanwhile.
CREATE TABLE IF NOT EXISTS chronos_cell_move_changes (
    partition  integer NOT NULL,
    id         text NOT NULL,
    n          bigint NOT NULL,
    PRIMARY KEY (partition, id)
);
CREATE SEQUENCE IF NOT EXISTS chronos_cell_move_change_n;

-- A moving partition's recurring schedules, taken out of the table at the cut-over and held here until the
-- cell they go to has them: no firer of either cell makes an occurrence of one meanwhile.
CREATE TABLE IF NOT EXISTS chronos_cell_move_outbox (LIKE chronos_messages);

-- What a move's watch on a partition runs, for each row of it that is written (its triggers, made and dropped
-- by the move, say which partition): its id noted in chronos_cell_move_changes. The move's own statements
-- (`SET LOCAL chronos.moving = 'on'`) are not noted. It runs with its owner's rights, as every process writes
-- through it whatever it was granted on the tables this migration adds.
CREATE OR REPLACE FUNCTION chronos_cell_move_note() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF current_setting('chronos.moving', true) IS DISTINCT FROM 'on' THEN
        INSERT INTO chronos_cell_move_changes AS c (partition, id, n)
        VALUES (TG_ARGV[0]::integer, CASE TG_OP WHEN 'DELETE' THEN OLD.id ELSE NEW.id END,
                nextval('chronos_cell_move_change_n'))
        ON CONFLICT (partition, id) DO UPDATE SET n = EXCLUDED.n;
    END IF;
    RETURN NULL;
END $$;

-- What a partition's freeze runs, from its cut-over on, before each change of one of its rows: nothing is
-- changed (no firer claims a row of it here any more, no operator changes one), but for a firer settling a
-- row it held when the partition froze (its delete once published, its hand-back) and the move's own
-- statements.
CREATE OR REPLACE FUNCTION chronos_cell_move_freeze() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('chronos.moving', true) = 'on'
       OR (OLD.readied_at IS NOT NULL AND (TG_OP = 'DELETE' OR NEW.readied_at IS NULL)) THEN
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
    RETURN NULL;
END $$;

-- Cancels and replaces this cell's consumers took that may have a message waiting in another cell (a cancel that
-- found no message here; a replace, whose earlier version may wait elsewhere): written in the transaction of the
-- write that took them, and forwarded by the consumers to every other cell (a cancel of the id there), then
-- forgotten. A cell that does not answer keeps them here until it does: none is dropped.
CREATE TABLE IF NOT EXISTS chronos_cell_forwards (
    id        text PRIMARY KEY,
    action    text NOT NULL CHECK (action IN ('cancel', 'replace')),
    noted_at  timestamptz NOT NULL DEFAULT now()
);

-- chronos: compatible from 8
-- A move's watch notes a partition's writes only while this cell records a move of the partition. Dropping a
-- watch's triggers takes the table's strongest lock, which waits for every transaction under way on the table,
-- among them a firer's claim that deletes (its batch held until Kafka acknowledged it), and every write to the
-- table waits behind the request meanwhile: the other partitions stalled for as long as the request waited. A
-- move that cannot have the lock at once leaves its triggers in place, and they note nothing from then on, even
-- should the partition come back to this cell: a row of it written here costs the trigger's check of the moves'
-- table, no note.
CREATE OR REPLACE FUNCTION chronos_cell_move_note() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF current_setting('chronos.moving', true) IS DISTINCT FROM 'on'
       AND EXISTS (SELECT FROM chronos_cell_moves WHERE partition = TG_ARGV[0]::integer) THEN
        INSERT INTO chronos_cell_move_changes AS c (partition, id, n)
        VALUES (TG_ARGV[0]::integer, CASE TG_OP WHEN 'DELETE' THEN OLD.id ELSE NEW.id END,
                nextval('chronos_cell_move_change_n'))
        ON CONFLICT (partition, id) DO UPDATE SET n = EXCLUDED.n;
    END IF;
    RETURN NULL;
END $$;

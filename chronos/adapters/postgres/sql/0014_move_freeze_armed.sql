-- chronos: compatible from 8
-- A moving partition's freeze (chronos_cell_move_freeze, migration 13) is made with its watch, when the move
-- begins, and holds the partition's rows only once the partition is closed in this cell (`moving` in
-- chronos_cell_partitions): the cut-over then changes the map alone, not the table's triggers. A change of the
-- triggers waits for every transaction that writes to the table to end, among them a firer's claim that deletes,
-- held open until Kafka acknowledged its batch, and every write to the table waits behind it meanwhile. The map
-- is read for the moving partition's rows only (the trigger's WHEN), and with the owner's rights, as the note
-- (whatever the processes' role was granted on the map).
CREATE OR REPLACE FUNCTION chronos_cell_move_freeze() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF current_setting('chronos.moving', true) = 'on'
       OR (OLD.readied_at IS NOT NULL AND (TG_OP = 'DELETE' OR NEW.readied_at IS NULL)) THEN
        NULL;  -- the move's own statements, a firer settling a row it holds: never held back
    ELSIF EXISTS (SELECT FROM chronos_cell_partitions WHERE partition = OLD.input_partition AND state = 'moving') THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;

-- chronos: compatible from 8
-- The last value the messages' seq has drawn (0 before the first), for a firer's claim that starts where its last
-- claim ended: rows written since it read this have a seq past it, and its claim looks below its mark for those
-- alone (claim_after). The sequence belongs to the owner, and the processes' role holds no grant on it (the
-- identity column draws its values without one): the function reads it with the owner's rights.
CREATE OR REPLACE FUNCTION chronos_last_seq() RETURNS bigint LANGUAGE sql
SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('chronos_messages', 'seq')::regclass), 0)
$$;

-- The latest occurrence a recurring schedule has created. A replace resets the schedule to the
-- first occurrence from now, which may be one a firer already created (claimed within the
-- lookahead): the firer skips occurrences up to this one, so none is created twice.
ALTER TABLE chronos_messages ADD COLUMN last_occurrence timestamptz;

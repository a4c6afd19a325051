-- chronos: compatible from 8
-- The partition of the input topic each message was read from (the consumer and the bulk job write it; NULL in
-- rows written before this version, and in the occurrences of recurring schedules, which fire where they are
-- made). A partition moved to another cell takes exactly its rows along, whoever produced them and by whatever
-- key. Nullable and without a default: adding it rewrites nothing, and the releases before it write NULL.
ALTER TABLE chronos_messages ADD COLUMN IF NOT EXISTS input_partition integer;

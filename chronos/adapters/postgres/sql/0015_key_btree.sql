-- chronos: compatible from 8
-- chronos: outside a transaction
-- `chronos list --key K` reads a B-tree of the key's hash instead of a hash index of the key. A hash index keeps
-- one key's entries in one bucket, a chain of pages that every insert of that key walks to its end: a key many
-- waiting messages share (a tenant's, a customer's) made each write of it slower as its rows grew, the consumers'
-- and the moves' alike. A B-tree finds a key's place in a few pages however many rows share it, and keeps a
-- repeated key's entries together (deduplication). 4 bytes a row, as before.
CREATE INDEX CONCURRENTLY IF NOT EXISTS chronos_messages_key_hash
    ON chronos_messages (hashtext(encode(key, 'hex'))) WHERE key IS NOT NULL AND readied_at IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS chronos_messages_key;

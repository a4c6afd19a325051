-- chronos: compatible from 8
-- chronos: outside a transaction
-- The index of the key's hash serves an operator's search by key alone, and every message with a key paid for it:
-- an entry written with the row, another left for vacuum by its delete (PostgreSQL's CPU and WAL on every
-- write: docs/benchmarks/latest.md). It is now built where an operator asks, by `chronos key-search on`
-- (the statement is create_key_search_index in queries.sql); a search by key without it reads the rows in
-- deadline order.
DROP INDEX CONCURRENTLY IF EXISTS chronos_messages_key_hash;

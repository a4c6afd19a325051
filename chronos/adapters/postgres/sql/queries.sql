-- All SQL the processes run, one statement per `-- name: x` block.

-- name: schema_version
SELECT coalesce(max(version), 0) FROM chronos_schema_version;

-- name: migrate_lock
-- One migrator at a time, until its transaction ends.
SELECT pg_advisory_xact_lock(%(lock)s);

-- name: migrate_session_lock
-- One migrator at a time, while a migration runs outside a transaction (until the unlock below): whether
-- this one got the lock. Never waited for in a statement: a statement waiting holds a snapshot, and the
-- concurrent index build of the migrator that holds the lock waits for every older snapshot to go.
SELECT pg_try_advisory_lock(%(lock)s);

-- name: migrate_session_unlock
SELECT pg_advisory_unlock(%(lock)s);

-- name: create_schema_version
-- Before the first migration: the table of applied migrations itself. compatible_from: the oldest schema
-- version whose processes run on the schema this migration makes (NULL: its own version).
CREATE TABLE IF NOT EXISTS chronos_schema_version (
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(),
    compatible_from integer
);

-- name: add_compatible_from
-- A table made before the compatibility window was recorded gets its column (every earlier migration
-- keeps NULL: compatible with its own version only).
ALTER TABLE chronos_schema_version ADD COLUMN IF NOT EXISTS compatible_from integer;

-- name: record_migration
INSERT INTO chronos_schema_version (version, name, compatible_from) VALUES (%(version)s, %(name)s, %(compatible_from)s);

-- name: compatible_from
-- The first migration after `mine` that processes of version `mine` do not run on: (its version, the
-- oldest version whose processes do); none when every later one is compatible with `mine`.
SELECT version, coalesce(compatible_from, version) FROM chronos_schema_version
 WHERE version > %(mine)s AND coalesce(compatible_from, version) > %(mine)s ORDER BY version LIMIT 1;

-- name: index_invalid
-- Whether an index of this name exists and is invalid: a CREATE INDEX CONCURRENTLY that did not finish.
SELECT coalesce((SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                  WHERE c.relname = %(index)s AND pg_table_is_visible(c.oid)), false);

-- name: drop_index_concurrently
-- The index name is a plain identifier taken from a migration file (checked before it is put here).
DROP INDEX CONCURRENTLY IF EXISTS {index};

-- name: key_search_index
-- The key-search index (chronos key-search): none, or whether it is valid (a build that did not finish
-- leaves it invalid, written to yet never read) and its size in bytes.
SELECT i.indisvalid, pg_relation_size(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relname = 'chronos_messages_key_hash' AND pg_table_is_visible(c.oid);

-- name: create_key_search_index
-- What `chronos list --key K` (and the actions' --filter --key, the console's search by key) read: a B-tree of
-- the key's hash, 4 bytes a row whatever the key's size, where a key many waiting messages share costs each
-- insert no more than a key of its own. Built without blocking a write.
CREATE INDEX CONCURRENTLY IF NOT EXISTS chronos_messages_key_hash
    ON chronos_messages (hashtext(encode(key, 'hex'))) WHERE key IS NOT NULL AND readied_at IS NULL;

-- name: drop_key_search_index
DROP INDEX CONCURRENTLY IF EXISTS chronos_messages_key_hash;

-- name: has_schema_version
SELECT to_regclass('chronos_schema_version') IS NOT NULL;

-- fragment: staging_columns
-- op: 'i' insert unless the id is waiting, 'u' insert or replace; ord keeps the input order.
id text, deadline_us bigint, topic text, key bytea, value bytea, headers bytea, ordering_key text,
cron text, timezone text, op text NOT NULL DEFAULT 'i', ord bigint GENERATED ALWAYS AS IDENTITY,
dst_policy text, input_partition integer

-- name: create_staging
-- The consumer's staging table, made once per connection and emptied at every commit.
CREATE TEMP TABLE IF NOT EXISTS chronos_staging (/* include: staging_columns */) ON COMMIT DELETE ROWS;

-- name: create_staging_in_transaction
-- Through a transaction pooler: made in the transaction that uses it and dropped at its end, so that
-- no table is left on a server connection the pooler lends to other clients next. (One left there by a
-- client that made it with create_staging is empty outside that client's transactions: used as it is.)
CREATE TEMP TABLE IF NOT EXISTS chronos_staging (/* include: staging_columns */) ON COMMIT DROP;

-- name: insert_from_staging
-- Epoch microseconds to timestamptz in whole seconds plus the remainder: `interval * number`
-- multiplies in float8, so `deadline_us * interval '1 microsecond'` rounded deadlines after about
-- 2255 and made 9999-12-31T23:59:59.999999 year 10000; each of these two products is exact.
-- The way back, `(extract(epoch FROM deadline) * 1000000)::bigint`, is numeric (PostgreSQL 14+): exact.
INSERT INTO chronos_messages (id, deadline, topic, key, value, headers, ordering_key, cron, timezone,
                              dst_policy, input_partition)
SELECT id, timestamptz 'epoch' + (deadline_us / 1000000) * interval '1 second'
                  + mod(deadline_us, 1000000) * interval '1 microsecond',
       topic, key, value, headers, ordering_key, cron, timezone, dst_policy, input_partition
FROM chronos_staging AS s
WHERE op = 'i'
  -- an id a firer's claim that deletes holds (the row still there to this statement, its transaction
  -- open) is left alone at once, as any waiting id is: ON CONFLICT alone would wait for that transaction
  AND s.id <> ALL (ARRAY(SELECT m.id FROM chronos_messages AS m
                         WHERE m.id = ANY (ARRAY(SELECT id FROM chronos_staging WHERE op = 'i'))))
ORDER BY ord
ON CONFLICT (id) DO NOTHING;

-- name: copy_messages
-- The consumer's inserts straight into the table, in input order (seq follows it): no staging
-- table, no INSERT ... SELECT, no speculative insertion. An id already waiting makes the whole COPY
-- fail (unique violation); the batch is then written again through the staging table, whose insert
-- leaves waiting ids alone (a batch read again after a crash).
COPY chronos_messages (id, deadline, topic, key, value, headers, ordering_key, cron, timezone, dst_policy,
                       input_partition)
FROM STDIN (FORMAT BINARY);

-- name: copy_staging_full
COPY chronos_staging (id, deadline_us, topic, key, value, headers, ordering_key, cron, timezone, op, dst_policy,
                      input_partition)
FROM STDIN (FORMAT BINARY);

-- name: upsert_from_staging
-- chronosAction: replace. A replaced row that a firer holds is handed back, so the new version
-- fires (the firer's delete then finds the row changed and leaves it), with no failed publishes
-- counted against it. A row a firer's claim that deletes holds is written once that firer's
-- transaction ends (the old version fired and gone: the new one is inserted; handed back: it is
-- replaced), so the new version fires either way, as for a stamped row: the wait ends after the
-- session's lock_timeout, and the whole batch is written again (IntakeStatements.apply). A replaced
-- recurring schedule keeps its last_occurrence: the firer skips occurrences already created by the old version.
-- The row takes the replace's input partition, where the message now comes from.
INSERT INTO chronos_messages (id, deadline, topic, key, value, headers, ordering_key, cron, timezone,
                              dst_policy, input_partition)
SELECT id, timestamptz 'epoch' + (deadline_us / 1000000) * interval '1 second'
                  + mod(deadline_us, 1000000) * interval '1 microsecond',
       topic, key, value, headers, ordering_key, cron, timezone, dst_policy, input_partition
FROM chronos_staging
WHERE op = 'u'
ORDER BY ord
ON CONFLICT (id) DO UPDATE SET
    deadline = EXCLUDED.deadline, topic = EXCLUDED.topic, key = EXCLUDED.key, value = EXCLUDED.value,
    headers = EXCLUDED.headers, ordering_key = EXCLUDED.ordering_key, cron = EXCLUDED.cron,
    timezone = EXCLUDED.timezone, readied_at = NULL, readied_by = NULL, enqueued_at = now(),
    dst_policy = EXCLUDED.dst_policy, attempts = 0, last_error = NULL, original_deadline = NULL,
    input_partition = EXCLUDED.input_partition;

-- fragment: held_sessions
-- The transactions firers hold open now, each with its firer's node and its start: a row one of them took
-- with the claim that deletes (CHRONOS_FIRER_CLAIM=delete) is still there to every other session until it
-- commits (the row gone) or rolls back (the row back), and has that transaction for its xmax: such a row is
-- in flight, held by that firer since then. A firer's other transactions last a statement (a claim or a
-- delete running): the rows they lock are being claimed or settled, in flight too. pg_stat_activity shows
-- every role each session's transaction and application name (store.application_name), and its start only
-- to the firers' own role and pg_read_all_stats (else NULL).
SELECT backend_xid AS held_xid, split_part(application_name, ' ', 3)::uuid AS held_by, xact_start AS held_since
FROM pg_stat_activity
WHERE backend_xid IS NOT NULL
  AND application_name ~ '^chronos firer [0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'

-- name: cancel
-- Each id cancelled, and whether it was in flight: a row stamped as claimed is deleted all the same (its
-- firer may still publish it); one a firer's claim that deletes holds is skipped, never waited for, and left
-- to its firer, which publishes it, or hands it back if it cannot. A row a firer took after this statement's
-- snapshot is waited for, up to the session's lock_timeout (IntakeStatements.apply writes the batch again,
-- and then skips it). The final SELECT reads the rows as they were before this statement's delete: those
-- there, not deleted and held are in flight. An id not returned is not in this cell, or is a row of a partition
-- on its way to another cell, frozen here (the move's freeze leaves it alone): the cancel is forwarded.
WITH holders AS MATERIALIZED (
    SELECT held_xid FROM (/* include: held_sessions */) AS h
), free AS MATERIALIZED (
    SELECT ctid FROM chronos_messages
    WHERE id = ANY(%(ids)s) AND xmax <> ALL (ARRAY(SELECT held_xid FROM holders))
    FOR UPDATE
), gone AS (
    DELETE FROM chronos_messages AS m USING free WHERE m.ctid = free.ctid
    RETURNING m.id, m.readied_at IS NOT NULL AS claimed
)
SELECT id, claimed FROM gone
UNION ALL
SELECT id, true FROM chronos_messages
WHERE id = ANY(%(ids)s) AND id <> ALL (ARRAY(SELECT id FROM gone))
  AND xmax = ANY (ARRAY(SELECT held_xid FROM holders));

-- Cancels and replaces forwarded between cells (chronos_cell_forwards, migration 13).

-- name: note_forwards
-- Written in the transaction of the consumer's write that took them.
INSERT INTO chronos_cell_forwards (id, action)
SELECT id, %(action)s FROM unnest(%(ids)s::text[]) AS id
ON CONFLICT (id) DO UPDATE SET action = EXCLUDED.action, noted_at = now();

-- name: pending_forwards
SELECT id, action, noted_at FROM chronos_cell_forwards ORDER BY noted_at, id LIMIT %(limit)s;

-- name: forget_forwards
-- Forwarded to every other cell: gone, unless noted again since. One a consumer's write is noting again right now
-- is left, to forward again: a write noting several in its own order and this in another would each wait for
-- the other (a deadlock).
DELETE FROM chronos_cell_forwards AS f
WHERE f.id IN (
    SELECT l.id
    FROM chronos_cell_forwards AS l
    JOIN unnest(%(ids)s::text[], %(noted)s::timestamptz[]) AS d(id, noted_at)
      ON l.id = d.id AND l.noted_at = d.noted_at
    FOR UPDATE OF l SKIP LOCKED);

-- name: waiting_ids
SELECT id FROM chronos_messages WHERE id = ANY(%(ids)s);

-- name: backend_pid
-- What the pool mode probe asks (chronos/adapters/postgres/pooling.py).
SELECT pg_backend_pid();

-- name: transaction_settings
-- Through a transaction pooler, the settings of hot_path_settings, async_commit and lock_timeout for one
-- transaction only: set_config(..., true) ends with the transaction (a session setting would stay on the
-- server connection the pooler lends to other clients next). NULL leaves a setting as it is.
SELECT set_config('enable_seqscan', coalesce(%(planner)s::text, current_setting('enable_seqscan')), true),
       set_config('enable_bitmapscan', coalesce(%(planner)s::text, current_setting('enable_bitmapscan')), true),
       set_config('jit', coalesce(%(planner)s::text, current_setting('jit')), true),
       set_config('max_parallel_workers_per_gather',
                  CASE WHEN %(planner)s::text IS NULL THEN current_setting('max_parallel_workers_per_gather') ELSE '0' END,
                  true),
       set_config('synchronous_commit', coalesce(%(synchronous_commit)s::text, current_setting('synchronous_commit')),
                  true),
       set_config('lock_timeout', coalesce(%(lock_timeout)s::text, current_setting('lock_timeout')), true);

-- name: lock_timeout
-- The consumer's session: a write that waits this long for a row's lock fails, and is tried again, rather
-- than wait for as long as a firer's claim that deletes holds the row (see `upsert_from_staging`).
SELECT set_config('lock_timeout', %(ms)s, false);

-- name: hot_path_settings
-- For the firer's, consumer's and detector's own connections (through a transaction pooler, for each
-- of their transactions: transaction_settings). Their statements reach rows through
-- an index condition or by TID; with sequential and bitmap scans disabled, no statistics (a table
-- analyzed while empty, a generic plan cached then, a bloated or huge table) can make the planner
-- prefer a plan that reads the whole table, since PostgreSQL picks the plan with the fewest
-- disabled nodes before comparing costs. (Where a statement has no other way, the scan still runs.)
-- JIT off: before PostgreSQL 18 a disabled scan adds 10^10 to the plan's cost, past every JIT threshold,
-- and compiling a statement took 100 to 300 ms of an execution that takes one (the firer's lease, the
-- consumer's writes from its staging table).
-- No parallel workers: a statement that walks a long stretch of the due index (a firer's full claim, the
-- detector's counts, under load and before autovacuum has come by) otherwise starts two more processes on
-- the cores the claims of rows due now need, and those rows went out later (docs/benchmarks/latest.md,
-- the firer's publish lateness at 40,000 msg/s).
SELECT set_config('enable_seqscan', 'off', false), set_config('enable_bitmapscan', 'off', false),
       set_config('jit', 'off', false), set_config('max_parallel_workers_per_gather', '0', false);

-- fragment: claim_held_back
-- The claim's ordering check (see `claim`), on its `candidates` (ctid, ordering_key, place, seq): `due`,
-- the candidates the claim may take.
keyed AS (
    SELECT ctid, ordering_key, place, seq,
           lag(place, 1, '-infinity') OVER w AS prev_place, lag(seq, 1, 0::bigint) OVER w AS prev_seq
    FROM candidates
    WHERE ordering_key IS NOT NULL
    WINDOW w AS (PARTITION BY ordering_key ORDER BY place, seq)
), held AS (
    SELECT ctid, bool_or(
               EXISTS (SELECT FROM chronos_messages AS e
                       WHERE e.ordering_key = k.ordering_key AND e.cron IS NULL AND e.original_deadline IS NULL
                         AND (e.deadline, e.seq) > (k.prev_place, k.prev_seq)
                         AND (e.deadline, e.seq) < (k.place, k.seq))
               OR EXISTS (SELECT FROM chronos_messages AS e
                          WHERE e.ordering_key = k.ordering_key AND e.original_deadline IS NOT NULL
                            AND (e.original_deadline, e.seq) > (k.prev_place, k.prev_seq)
                            AND (e.original_deadline, e.seq) < (k.place, k.seq)))
           OVER (PARTITION BY ordering_key ORDER BY place, seq) AS held
    FROM keyed AS k
), due AS (
    SELECT ctid FROM candidates WHERE ordering_key IS NULL
    UNION ALL
    SELECT ctid FROM held WHERE NOT held
)

-- fragment: claim_rows
-- The claim's last part: its `due` rows stamped as this node's, and returned as a claimed row is read
-- (chronos.domain.model.Claimed).
UPDATE chronos_messages AS m
SET readied_at = now(), readied_by = %(node)s
FROM due
WHERE m.ctid = due.ctid
RETURNING m.id, (extract(epoch FROM m.deadline) * 1000000)::bigint, m.topic, m.key, m.value, m.headers,
          m.readied_at, m.seq,
          m.attempts, (extract(epoch FROM m.original_deadline) * 1000000)::bigint, m.ctid

-- fragment: pick_rows
-- The claim's last part in its `pick` twin: the claim that deletes (CHRONOS_FIRER_CLAIM=delete) takes a
-- claim's rows in two statements, this one to choose them and `take` to delete them (chronos/adapters/
-- postgres/takes.py). The pick is the claim without its FOR UPDATE SKIP LOCKED, and without the rows firers
-- hold (held_xids, read just before it): a lock it took would last until the firer's transaction ends, also on
-- the candidates the ordering check holds back, which no one else could then claim, cancel or change meanwhile.
-- It returns how many rows it chose, their TIDs as one array, and how many candidates it had: fewer rows than
-- candidates, and the ordering check held some back (chronos/adapters/postgres/queries.py makes the picks).
SELECT count(*), coalesce(array_agg(ctid)::text, '{}'), (SELECT count(*) FROM candidates) FROM due

-- name: claim
-- A row with an ordering key is claimable only if every earlier row of its key (by deadline,
-- then enqueue order) is claimed by this same statement: a row held by a peer, locked by a
-- concurrent claim (skipped) or still waiting holds back the later rows of its key only. A row's
-- place in its key is (coalesce(original_deadline, deadline), seq): a retry's backoff moves the
-- deadline only later, so that is also the earliest of its two positions. The check compares no
-- rows with each other: a candidate is held back when a row of its key lies strictly between it
-- and the candidate before it of that key (such a row is no candidate; one index range probe per
-- position), and so is every later candidate of the key. Rows are updated by TID (the CTE's
-- ctid): with no usable index path the planner can only reach them one by one.
-- With fire-rate limits the claim goes topic by topic: `claim_topic` (one topic named by
-- chronosTopic, off the topic index, so a throttled backlog of one topic never stands in front of
-- another's due rows) and `claim_output_topic` (rows without chronosTopic, off the due index) are
-- this statement with a topic filter at the mark (chronos/adapters/postgres/queries.py makes them).
-- `claim_recent` is this statement with a lower bound on the deadline at the mark (the firer's claims
-- between full ones, see Claimer.claim_rows): the due index keeps an entry for every row claimed
-- since its last vacuum, all at the head of its range, and a scan from the start walks them all.
-- `claim_share` and `claim_share_recent` are this statement within a firer's own slices at the mark
-- (chronos.domain.shares; queries.py: OWN_SLICES), and `claim_share_after` is `claim_after` so.
WITH candidates AS MATERIALIZED (
    SELECT ctid, ordering_key, coalesce(original_deadline, deadline) AS place, seq FROM chronos_messages
    WHERE readied_at IS NULL AND cron IS NULL /* topic filter */
      -- now(), not clock_timestamp(): a stable bound is an index condition, so the scan stops at
      -- the first row not yet due instead of filtering every far-future row (autocommit: now() is
      -- this statement's start; through a transaction pooler the claim shares its transaction with
      -- transaction_settings, sent just before it, so now() is when that one started, microseconds
      -- earlier: a row due in between waits for the next claim, as one due just after a claim does)
      AND deadline <= now() + %(lookahead_ms)s * interval '1 millisecond'
    ORDER BY deadline, seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), /* include: claim_held_back */
/* include: claim_rows */;

-- name: claim_after
-- `claim` from where the firer's last claim ended (ClaimCursor): the rows past that (deadline, seq), and below
-- it only rows written since the firer last read the sequence (%(since_seq)s: chronos_last_seq), which the
-- index tells from the others without a visit to the table. Below the mark the due index holds an entry for
-- every row the firer took in the last moments, those in flight and those whose deletes it has not yet learnt
-- of, and `claim_recent` visits each of them in the table every time. A row that lands below the mark with an
-- older seq (put back, or written by a transaction under way at that read) waits for the firer's next full
-- claim. Each part is at most the limit, and the claim the first `limit` of both in (deadline, seq) order.
WITH past AS MATERIALIZED (
    SELECT ctid, ordering_key, coalesce(original_deadline, deadline) AS place, seq, deadline FROM chronos_messages
    WHERE readied_at IS NULL AND cron IS NULL /* topic filter */
      AND deadline <= now() + %(lookahead_ms)s * interval '1 millisecond'
      AND (deadline, seq) > ('epoch'::timestamptz + %(after_us)s * interval '1 microsecond', %(after_seq)s::bigint)
    ORDER BY deadline, seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), late AS MATERIALIZED (
    SELECT ctid, ordering_key, coalesce(original_deadline, deadline) AS place, seq, deadline FROM chronos_messages
    WHERE readied_at IS NULL AND cron IS NULL /* topic filter */
      AND deadline >= now() - %(window_ms)s * interval '1 millisecond'
      AND (deadline, seq) <= ('epoch'::timestamptz + %(after_us)s * interval '1 microsecond', %(after_seq)s::bigint)
      AND seq > %(since_seq)s::bigint
    ORDER BY deadline, seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), candidates AS MATERIALIZED (
    SELECT ctid, ordering_key, place, seq FROM (SELECT * FROM late UNION ALL SELECT * FROM past) AS both_parts
    ORDER BY deadline, seq
    LIMIT %(limit)s
), /* include: claim_held_back */
/* include: claim_rows */;

-- name: last_seq
SELECT chronos_last_seq();

-- name: last_seq_allowed
-- Whether this role may run chronos_last_seq(): EXECUTE is PUBLIC's unless an install revoked it.
SELECT has_function_privilege('chronos_last_seq()', 'EXECUTE');

-- name: firer_heartbeat
-- A firer's lease renewed (made at its first call), the leases expired for good dropped, and the
-- other firers seen within the hold time: the live ones, among which the slices are divided, each
-- with its lease's age in milliseconds (whether it has gone quiet).
WITH renewed AS (
    INSERT INTO chronos_firers (node, seen_at) VALUES (%(node)s, now())
    ON CONFLICT (node) DO UPDATE SET seen_at = now()
), expired AS (
    DELETE FROM chronos_firers WHERE node <> %(node)s AND seen_at <= now() - %(hold_ms)s * interval '1 millisecond'
)
SELECT node, (extract(epoch FROM now() - seen_at) * 1000)::int FROM chronos_firers
WHERE node <> %(node)s AND seen_at > now() - %(hold_ms)s * interval '1 millisecond';

-- name: firer_leave
-- A firer that stops gives its slices up at once, rather than after the hold time.
DELETE FROM chronos_firers WHERE node = %(node)s;

-- The claim that deletes (CHRONOS_FIRER_CLAIM=delete): a batch's rows chosen by a `pick` (each claim's
-- twin, see pick_rows) and deleted by `take` in a transaction the firer holds open on a session of its own
-- until Kafka has acknowledged them, then committed; rolled back, every row is back as it was. While the
-- transaction is open the rows are still there for every other session, deleted by it (held_sessions): a
-- claim leaves them out, a cancel or an operator's action leaves them to their firer and calls them in
-- flight, a write of the same id waits for the transaction to end. PostgreSQL ends the transaction of a
-- firer gone silent (dead, hung, cut off) after the hold time (held_session_settings), and the rows are back.

-- name: begin_held
BEGIN;

-- fragment: taken_columns
-- What a take returns of each row: a claimed row (chronos.domain.model.Claimed; now() is when the
-- transaction began, the claim's time), with what `restore_taken` needs to put it back. Its rows are read in
-- binary (TakeStatements): the TID as text, which psycopg has no binary loader for.
m.id, (extract(epoch FROM m.deadline) * 1000000)::bigint, m.topic, m.key, m.value, m.headers, now(), m.seq,
m.attempts, (extract(epoch FROM m.original_deadline) * 1000000)::bigint, m.ctid::text, m.ordering_key, m.enqueued_at,
m.last_error, m.input_partition

-- fragment: not_moving
-- A row of a partition closed here on its way to another cell (`moving` in chronos_cell_partitions) is no
-- pick's and no take's: its freeze (chronos_cell_move_freeze) would skip the take's delete of it, but only once
-- the row is locked, and that lock lasts as long as the firer's held transaction, so a firer taking again and
-- again would hold the partition's rows from the move's cut-over for as long as it fires. The moving partitions
-- are read once per statement; each row is compared with none while no partition moves.
AND coalesce(input_partition, -1) <> ALL (ARRAY(SELECT partition FROM chronos_cell_partitions WHERE state = 'moving'))

-- name: held_xids
-- The transactions firers hold open now (held_sessions), as one array a pick leaves their rows out by. It is read
-- in a statement of its own, before the pick's: a statement's snapshot is taken as it starts, and its read of
-- pg_stat_activity comes later, so a batch committed between the two was in progress to the pick's snapshot (its
-- rows still there) yet no longer held: a pick that read both at once chose a whole committed batch again, and its
-- take found none of it (under load, one claim in fifty came back empty so, its rows then a poll interval late).
-- Read first, a transaction held then and committed before the pick's snapshot has its rows gone from it.
SELECT coalesce(array_agg(held_xid)::text, '{}') FROM (/* include: held_sessions */) AS holders

-- name: take
-- The rows a pick chose, deleted by TID in the firer's held transaction. A row taken or stamped by another
-- firer since the pick is waited for, up to the session's lock_timeout (the batch then rolls back, and the
-- claim goes on with the next one); one changed or deleted meanwhile is left out (its newest version, checked
-- again, lies at another TID), and with it the rows of its ordering key (TakeStatements), and so is one whose
-- partition began moving since (not_moving). Joined by TID, with no other condition on the row an index
-- could serve (as delete_fired): `ctid = ANY(...)`, or a condition in the words of a partial index's
-- predicate, and the planner read that index whole instead.
DELETE FROM chronos_messages AS m
USING unnest(%(ctids)s::tid[]) AS t(ctid)
WHERE m.ctid = t.ctid /* include: not_moving */
RETURNING /* include: taken_columns */;

-- name: held_session_settings
-- A firer's session for the claim that deletes: PostgreSQL ends the session, and rolls its transaction
-- back, once it has been idle in a transaction for the hold time (a firer that died, hangs or was cut off:
-- its rows are back for the others), or, from PostgreSQL 17, once its transaction is that old whatever it
-- does; the server's TCP keepalives and user timeout notice a peer gone within the hold time too. With
-- %(local)s, for the transaction only (through a pooler in transaction mode).
-- A take that finds a row locked gives up after %(lock_ms)s (see `take`). The application name is the
-- firer's whatever the URL says: held_sessions knows a firer's transactions by it.
SELECT set_config(name, setting, %(local)s)
FROM (VALUES ('idle_in_transaction_session_timeout', %(hold_ms)s::text), ('transaction_timeout', %(hold_ms)s::text),
             ('tcp_keepalives_idle', %(keepalive_s)s::text), ('tcp_keepalives_interval', %(keepalive_s)s::text),
             ('tcp_keepalives_count', '2'), ('tcp_user_timeout', %(hold_ms)s::text),
             ('lock_timeout', %(lock_ms)s::text), ('application_name', %(application_name)s::text)) AS s(name, setting)
WHERE name <> 'transaction_timeout' OR current_setting('server_version_num')::int >= 170000;

-- fragment: taken_rows
-- The rows a firer's held transaction deleted, as its statements below take them back: one array per
-- column, of the rows as they were claimed (chronos.domain.model.Claimed).
unnest(%(ids)s::text[], %(deadline_us)s::bigint[], %(topics)s::text[], %(keys)s::bytea[], %(values)s::bytea[],
       %(headers)s::bytea[], %(ordering_keys)s::text[], %(enqueued_at)s::timestamptz[], %(seqs)s::bigint[],
       %(attempts)s::int[], %(errors)s::text[], %(original_us)s::bigint[], %(delay_ms)s::bigint[],
       %(input_partitions)s::int[])
    AS r(id, deadline_us, topic, key, value, headers, ordering_key, enqueued_at, seq, attempts, error,
         original_us, delay_ms, input_partition)

-- name: restore_taken
-- Rows the held transaction deleted, put back in it before it commits: handed back as they were (delay_ms
-- NULL, error the row's last), or put off for a retry (the failure counted, the deadline moved by the delay
-- from now, the deadline as scheduled kept in original_deadline), as `release` and `retry_later` do to a
-- stamped row. The same seq: a row keeps its place in its ordering key. clock_timestamp(), not now(): now()
-- is when the transaction began, up to the hold time ago. The row keeps its input partition: a move of the
-- partition takes it along.
INSERT INTO chronos_messages (id, deadline, topic, key, value, headers, ordering_key, enqueued_at, seq, attempts,
                              last_error, original_deadline, input_partition)
OVERRIDING SYSTEM VALUE
SELECT r.id,
       CASE WHEN r.delay_ms IS NULL THEN d.deadline
            ELSE greatest(d.deadline, clock_timestamp()) + r.delay_ms * interval '1 millisecond' END,
       r.topic, r.key, r.value, r.headers, r.ordering_key, r.enqueued_at, r.seq,
       r.attempts + (r.delay_ms IS NOT NULL)::int, r.error,
       CASE WHEN r.delay_ms IS NULL THEN d.original ELSE coalesce(d.original, d.deadline) END, r.input_partition
FROM /* include: taken_rows */
CROSS JOIN LATERAL (
    SELECT timestamptz 'epoch' + (r.deadline_us / 1000000) * interval '1 second'
               + mod(r.deadline_us, 1000000) * interval '1 microsecond' AS deadline,
           timestamptz 'epoch' + (r.original_us / 1000000) * interval '1 second'
               + mod(r.original_us, 1000000) * interval '1 microsecond' AS original
) AS d;

-- name: park_taken
-- Rows the held transaction deleted that neither their destination nor the dead-letter topic accept:
-- kept in chronos_parked, in that transaction (errors: each one's reason), as `park_claimed` does.
INSERT INTO chronos_parked (message_id, source, topic, deadline, key, value, headers, reason)
SELECT r.id, 'store/' || r.id, coalesce(r.topic, %(output_topic)s),
       timestamptz 'epoch' + (coalesce(r.original_us, r.deadline_us) / 1000000) * interval '1 second'
           + mod(coalesce(r.original_us, r.deadline_us), 1000000) * interval '1 microsecond',
       r.key, r.value, r.headers, r.error
FROM /* include: taken_rows */;

-- name: due_schedules
SELECT id, (extract(epoch FROM deadline) * 1000000)::bigint, cron, timezone, topic, key, value, headers,
       ordering_key, (extract(epoch FROM last_occurrence) * 1000000)::bigint, dst_policy
FROM chronos_messages
WHERE cron IS NOT NULL AND deadline <= now() + %(lookahead_ms)s * interval '1 millisecond'
ORDER BY deadline
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: insert_occurrence
-- One occurrence of a recurring schedule, created already claimed by this firer.
INSERT INTO chronos_messages (id, deadline, topic, key, value, headers, ordering_key, readied_at, readied_by)
VALUES (%(id)s, timestamptz 'epoch' + (%(deadline_us)s::bigint / 1000000) * interval '1 second'
        + mod(%(deadline_us)s::bigint, 1000000) * interval '1 microsecond', %(topic)s, %(key)s, %(value)s,
        %(headers)s, %(ordering_key)s, now(), %(node)s)
ON CONFLICT (id) DO NOTHING
RETURNING id, (extract(epoch FROM deadline) * 1000000)::bigint, topic, key, value, headers, readied_at, seq,
          0, NULL::bigint, ctid;

-- name: advance_schedule
-- %(last_us)s: the occurrence just created, or NULL when none was (the latest one stays).
UPDATE chronos_messages
SET deadline = timestamptz 'epoch' + (%(next_us)s::bigint / 1000000) * interval '1 second'
               + mod(%(next_us)s::bigint, 1000000) * interval '1 microsecond',
    last_occurrence = coalesce(timestamptz 'epoch' + (%(last_us)s::bigint / 1000000) * interval '1 second'
                               + mod(%(last_us)s::bigint, 1000000) * interval '1 microsecond', last_occurrence)
WHERE id = %(id)s;

-- name: list_schedules
SELECT id, cron, coalesce(timezone, 'UTC'), (extract(epoch FROM deadline) * 1000000)::bigint, topic,
       ordering_key, enqueued_at
FROM chronos_messages WHERE cron IS NOT NULL ORDER BY deadline, id;

-- name: delete_fired
-- Exactly the rows as this node claimed them, reached by the TID the claim returned: (ctid, id,
-- readied_at) triples. A row updated since (handed to a peer, replaced) has moved and is left
-- alone. The id and readied_at are compared with `IS NOT DISTINCT FROM` (never null here, so
-- the same as `=`) so that they offer the planner no index path, and no way round the TID.
DELETE FROM chronos_messages AS m
USING unnest(%(ctids)s::tid[], %(ids)s::text[], %(readied_at)s::timestamptz[]) AS f(ctid, id, readied_at)
WHERE m.ctid = f.ctid AND m.id IS NOT DISTINCT FROM f.id AND m.readied_by = %(node)s
  AND m.readied_at IS NOT DISTINCT FROM f.readied_at;

-- name: release
-- (by TID: see delete_fired)
UPDATE chronos_messages AS m
SET readied_at = NULL, readied_by = NULL
FROM unnest(%(ctids)s::tid[], %(ids)s::text[], %(readied_at)s::timestamptz[]) AS f(ctid, id, readied_at)
WHERE m.ctid = f.ctid AND m.id IS NOT DISTINCT FROM f.id AND m.readied_by = %(node)s
  AND m.readied_at IS NOT DISTINCT FROM f.readied_at;

-- name: retry_later
-- A publish the destination refused: hand the row back with the failure counted and its deadline
-- moved by the backoff, so it leaves the head of the claim and other due rows fire meanwhile; the
-- deadline as scheduled is kept in original_deadline. (IS NOT DISTINCT FROM: see delete_fired)
UPDATE chronos_messages AS m
SET readied_at = NULL, readied_by = NULL, attempts = m.attempts + 1, last_error = f.error,
    original_deadline = coalesce(m.original_deadline, m.deadline),
    deadline = greatest(m.deadline, now()) + f.delay_ms * interval '1 millisecond'
FROM unnest(%(ids)s::text[], %(readied_at)s::timestamptz[], %(errors)s::text[], %(delay_ms)s::bigint[])
     AS f(id, readied_at, error, delay_ms)
WHERE m.id = f.id AND m.readied_by = %(node)s AND m.readied_at IS NOT DISTINCT FROM f.readied_at;

-- name: park_claimed
-- Rows that neither their destination nor the dead-letter topic accept: moved, in this one
-- statement, from the store to chronos_parked, exactly as this node claimed them.
WITH moved AS (
    DELETE FROM chronos_messages AS m
    USING unnest(%(ids)s::text[], %(readied_at)s::timestamptz[], %(reasons)s::text[]) AS f(id, readied_at, reason)
    WHERE m.id = f.id AND m.readied_by = %(node)s AND m.readied_at IS NOT DISTINCT FROM f.readied_at
    RETURNING m.id, m.topic, coalesce(m.original_deadline, m.deadline) AS deadline, m.key, m.value, m.headers,
              f.reason
)
INSERT INTO chronos_parked (message_id, source, topic, deadline, key, value, headers, reason)
SELECT id, 'store/' || id, coalesce(topic, %(output_topic)s), deadline, key, value, headers, reason FROM moved;

-- name: park_message
-- A message from the input topic that no topic accepted (its destination nor the dead-letter topic).
INSERT INTO chronos_parked (message_id, source, topic, deadline, key, value, headers, reason)
VALUES (%(message_id)s, %(source)s, %(topic)s, %(deadline)s, %(key)s, %(value)s, %(headers)s, %(reason)s);

-- name: has_parked
SELECT to_regclass('chronos_parked') IS NOT NULL;

-- name: count_parked
SELECT count(*) FROM chronos_parked;

-- name: find_stale
SELECT id, readied_at, readied_by, ctid FROM chronos_messages
WHERE readied_at IS NOT NULL AND readied_at < now() - %(hold_ms)s * interval '1 millisecond'
ORDER BY readied_at
LIMIT %(limit)s;

-- name: reset_stale
-- (by TID: see delete_fired)
UPDATE chronos_messages AS m
SET readied_at = NULL, readied_by = NULL
FROM unnest(%(ctids)s::tid[], %(ids)s::text[], %(readied_at)s::timestamptz[], %(readied_by)s::uuid[])
     AS s(ctid, id, readied_at, readied_by)
WHERE m.ctid = s.ctid AND m.id IS NOT DISTINCT FROM s.id AND m.readied_by IS NOT DISTINCT FROM s.readied_by
  AND m.readied_at IS NOT DISTINCT FROM s.readied_at
RETURNING s.readied_by;

-- name: async_commit
-- The firer's sessions only: a claim, delete or hand-back lost in a crash only fires a row again
-- (at-least-once), so they need not wait for the WAL flush. The consumer's stay synchronous.
SET synchronous_commit = off;

-- name: db_clock
SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;

-- name: overview_features
-- What this schema holds, for `chronos status`: recurring schedules as rows with a `cron` column
-- (not before migration 0002); and the planner's row estimate (-1 before the first ANALYZE).
SELECT EXISTS (SELECT FROM pg_attribute
               WHERE attrelid = 'chronos_messages'::regclass AND attname = 'cron' AND NOT attisdropped),
       (SELECT reltuples FROM pg_class WHERE oid = 'chronos_messages'::regclass)::bigint;

-- name: overview_in_flight
-- Claimed rows per firer node, off the partial index on readied_at (in-flight rows are few).
SELECT readied_by, count(*),
       count(*) FILTER (WHERE readied_at < now() - %(hold_ms)s * interval '1 millisecond'),
       extract(epoch FROM now() - min(readied_at))::float8, min(deadline)
FROM chronos_messages
WHERE readied_at IS NOT NULL
GROUP BY readied_by
ORDER BY count(*) DESC, readied_by;

-- name: overview_held
-- Rows firers' claims that delete hold (held_sessions), per firer, with the other columns of
-- overview_in_flight, and how many of them are due (to leave out of the due count): looked for among the
-- first %(cap)s rows due by now plus %(within_ms)s (a held row was taken at most the lookahead ahead of its
-- deadline, within the hold time), and only while some firer holds a transaction open.
WITH held AS MATERIALIZED (/* include: held_sessions */)
SELECT h.held_by, count(*),
       count(*) FILTER (WHERE h.held_since < now() - %(hold_ms)s * interval '1 millisecond'),
       coalesce(extract(epoch FROM now() - min(h.held_since))::float8, 0), min(m.deadline),
       count(*) FILTER (WHERE m.deadline <= now())
FROM (SELECT xmax, deadline FROM chronos_messages
      WHERE readied_at IS NULL AND cron IS NULL AND deadline <= now() + %(within_ms)s * interval '1 millisecond'
        AND EXISTS (SELECT FROM held)
      ORDER BY deadline, seq LIMIT %(cap)s) AS m
JOIN held AS h ON h.held_xid = m.xmax
GROUP BY h.held_by;

-- name: overview_waiting
-- Unclaimed rows. The first and next deadlines come off the partial due index; the count runs
-- only when %(exact)s (else the caller uses the estimate); the due count stops at %(due_cap)s.
SELECT now(),
       (SELECT min(deadline) FROM chronos_messages WHERE readied_at IS NULL),
       (SELECT min(deadline) FROM chronos_messages WHERE readied_at IS NULL AND deadline > now()),
       CASE WHEN %(exact)s THEN (SELECT count(*) FROM chronos_messages WHERE readied_at IS NULL) END,
       (SELECT count(*) FROM (SELECT FROM chronos_messages WHERE readied_at IS NULL AND deadline <= now()
                              LIMIT %(due_cap)s) AS due);

-- name: overview_waiting_cron
-- overview_waiting on a schema where rows with a `cron` expression are recurring schedules.
SELECT now(),
       (SELECT min(deadline) FROM chronos_messages WHERE readied_at IS NULL AND cron IS NULL),
       (SELECT min(deadline) FROM chronos_messages WHERE readied_at IS NULL AND cron IS NULL AND deadline > now()),
       CASE WHEN %(exact)s THEN (SELECT count(*) FROM chronos_messages WHERE readied_at IS NULL AND cron IS NULL) END,
       (SELECT count(*) FROM (SELECT FROM chronos_messages
                              WHERE readied_at IS NULL AND cron IS NULL AND deadline <= now()
                              LIMIT %(due_cap)s) AS due);

-- name: count_cron_schedules
SELECT count(*) FROM chronos_messages WHERE cron IS NOT NULL;

-- Operators: `chronos show`, `list`, `cancel`, `fire-now`, `reschedule` (the OperatorsStore port, chronos/ports.py;
-- chronos/ops/inspect.py walks filters and actions in batches over it).

-- name: show_message
-- The value's size and its first bytes only: a value may be megabytes. A row a firer's claim that deletes
-- holds is in flight, held by that firer since its transaction began (held_sessions).
WITH held AS MATERIALIZED (/* include: held_sessions */)
SELECT id, deadline, coalesce(readied_at, h.held_since), coalesce(readied_by, h.held_by), topic, key,
       octet_length(value), substring(value FROM 1 FOR %(preview)s),
       headers, ordering_key, enqueued_at, cron, timezone, dst_policy, attempts, last_error, original_deadline,
       readied_at IS NOT NULL OR h.held_by IS NOT NULL
FROM chronos_messages AS m LEFT JOIN held AS h ON h.held_xid = m.xmax
WHERE id = %(id)s;

-- Parked messages (`chronos parked list|show|replay|drop`, the console's Parked page and its actions):
-- few rows, each a message no topic took, walked along the primary key; the filters are checked on
-- the rows the walk reads.

-- fragment: parked_filters
-- The parked messages' filters (every one optional: NULL, none), put where a statement says
-- `/* include: parked_filters */`. A reason's code is the text before its first colon.
AND (%(topic)s::text IS NULL OR topic = %(topic)s)
AND (%(reason)s::text IS NULL OR split_part(reason, ':', 1) = %(reason)s)
AND (%(parked_after)s::timestamptz IS NULL OR parked_at > %(parked_after)s)
AND (%(parked_before)s::timestamptz IS NULL OR parked_at < %(parked_before)s)
AND (%(id_prefix)s::text IS NULL OR starts_with(message_id, %(id_prefix)s))

-- name: list_parked
-- Newest first, a page at a time before a cursor (the primary key, backwards).
SELECT id, message_id, source, topic, deadline, key, octet_length(value), substring(value FROM 1 FOR %(preview)s),
       headers, reason, parked_at
FROM chronos_parked
WHERE (%(before)s::bigint IS NULL OR id < %(before)s::bigint) /* include: parked_filters */
ORDER BY id DESC
LIMIT %(limit)s;

-- name: show_parked
SELECT id, message_id, source, topic, deadline, key, octet_length(value), substring(value FROM 1 FOR %(preview)s),
       headers, reason, parked_at
FROM chronos_parked WHERE id = %(number)s;

-- name: find_parked
-- Which of these numbers are parked, where each was going and its size: what an action by number acts on.
SELECT id, topic, coalesce(octet_length(key), 0) + coalesce(octet_length(value), 0) + coalesce(octet_length(headers), 0)
FROM chronos_parked WHERE id = ANY(%(numbers)s::bigint[])
ORDER BY id;

-- name: walk_parked
-- What an action by filter acts on, a batch at a time, oldest first (a replay publishes in the order
-- parked), after a cursor.
SELECT id, topic, coalesce(octet_length(key), 0) + coalesce(octet_length(value), 0) + coalesce(octet_length(headers), 0)
FROM chronos_parked
WHERE (%(after)s::bigint IS NULL OR id > %(after)s::bigint) /* include: parked_filters */
ORDER BY id
LIMIT %(limit)s;

-- name: load_parked
-- Parked messages whole, as a replay publishes them.
SELECT id, message_id, topic, key, value, headers FROM chronos_parked WHERE id = ANY(%(numbers)s::bigint[])
ORDER BY id;

-- name: delete_parked
-- Replayed (Kafka acknowledged them) or dropped.
DELETE FROM chronos_parked WHERE id = ANY(%(numbers)s::bigint[]) RETURNING id;

-- name: refused_parked
-- A replay Kafka refused: the message stays parked, with why it was refused this time.
UPDATE chronos_parked AS p SET reason = f.reason
FROM unnest(%(numbers)s::bigint[], %(reasons)s::text[]) AS f(id, reason)
WHERE p.id = f.id;

-- fragment: message_filters
-- The operators' filters (every one optional: NULL, none) of list_by_deadline and list_by_id, put
-- where a statement says `/* include: message_filters */`.
AND (%(due_after)s::timestamptz IS NULL OR deadline > %(due_after)s)
AND (%(due_before)s::timestamptz IS NULL OR deadline < %(due_before)s)
AND (%(not_at)s::timestamptz IS NULL OR deadline <> %(not_at)s)
AND (%(topic)s::text IS NULL OR topic = %(topic)s) AND (NOT %(output_topic)s::bool OR topic IS NULL)
AND (%(key)s::bytea IS NULL OR (hashtext(encode(key, 'hex')) = hashtext(encode(%(key)s::bytea, 'hex')) AND key = %(key)s))
AND (%(ordering_key)s::text IS NULL OR ordering_key = %(ordering_key)s)

-- fragment: deadline_page
-- The rest of each branch of list_by_deadline: after the keyset cursor, one page in (deadline, seq) order.
AND (%(after_deadline)s::timestamptz IS NULL OR (deadline, seq) > (%(after_deadline)s, %(after_seq)s::bigint))
ORDER BY deadline, seq LIMIT %(limit)s

-- name: list_by_deadline
-- One page in (deadline, seq) order, after the keyset cursor. Every filter is optional (NULL: none).
-- Run unprepared, so each call is planned for its own values: `NULL IS NULL OR ...` folds away and
-- what remains picks the index. One branch per state, each off its own partial index (due,
-- in-flight, schedules), or the ordering, topic or key index when that filter is given. Rows a
-- firer's claim that deletes holds (held_sessions) are in flight: looked for among the rows due by
-- now plus %(held_within_ms)s (a held row was taken at most the lookahead ahead of its deadline,
-- within the hold time).
WITH held AS MATERIALIZED (/* include: held_sessions */)
SELECT * FROM (
    (SELECT 'waiting' AS state, id, deadline, seq, topic, key, ordering_key, readied_by, cron
     FROM chronos_messages
     WHERE readied_at IS NULL AND cron IS NULL AND coalesce(%(state)s::text, 'waiting') = 'waiting'
       AND xmax <> ALL (ARRAY(SELECT held_xid FROM held))
       /* include: message_filters */ /* include: deadline_page */)
    UNION ALL
    (SELECT 'in_flight', id, deadline, seq, topic, key, ordering_key, readied_by, cron
     FROM chronos_messages
     WHERE readied_at IS NOT NULL AND coalesce(%(state)s::text, 'in_flight') = 'in_flight'
       /* include: message_filters */ /* include: deadline_page */)
    UNION ALL
    (SELECT 'in_flight', id, deadline, seq, topic, key, ordering_key, held_by, cron
     FROM chronos_messages JOIN held ON held_xid = xmax
     WHERE readied_at IS NULL AND cron IS NULL AND coalesce(%(state)s::text, 'in_flight') = 'in_flight'
       AND deadline <= now() + %(held_within_ms)s * interval '1 millisecond'
       /* include: message_filters */ /* include: deadline_page */)
    UNION ALL
    (SELECT 'recurring', id, deadline, seq, topic, key, ordering_key, readied_by, cron
     FROM chronos_messages
     WHERE cron IS NOT NULL AND coalesce(%(state)s::text, 'recurring') = 'recurring'
       /* include: message_filters */ /* include: deadline_page */)
) AS page
ORDER BY deadline, seq LIMIT %(limit)s;

-- name: list_by_id
-- `--id-prefix`: one page in id order off the primary key. starts_with() becomes a range condition
-- on the key where the column's collation is C (the embedded PostgreSQL's); under another
-- collation it is correct but a scan. The other filters as in list_by_deadline.
WITH held AS MATERIALIZED (/* include: held_sessions */)
SELECT CASE WHEN cron IS NOT NULL THEN 'recurring'
            WHEN readied_at IS NOT NULL OR held_by IS NOT NULL THEN 'in_flight' ELSE 'waiting' END,
       id, deadline, seq, topic, key, ordering_key, coalesce(readied_by, held_by), cron
FROM chronos_messages LEFT JOIN held ON held_xid = xmax
WHERE starts_with(id, %(id_prefix)s) AND (%(after_id)s::text IS NULL OR id > %(after_id)s)
  AND (%(state)s::text IS NULL
       OR CASE %(state)s::text WHEN 'waiting' THEN readied_at IS NULL AND cron IS NULL AND held_by IS NULL
                               WHEN 'in_flight' THEN readied_at IS NOT NULL OR held_by IS NOT NULL
                               ELSE cron IS NOT NULL END)
  /* include: message_filters */
ORDER BY id LIMIT %(limit)s;

-- name: act_cancel
-- Actions change only rows no firer holds: a claimed row is being published from a firer's memory
-- at the deadline it was claimed with, and nothing here could stop that. A concurrent claim locks
-- the row first; this statement then re-reads it, finds it claimed (or, taken by a claim that
-- deletes, gone once that firer commits) and leaves it. A row a firer's claim that deletes holds
-- already is skipped without a wait.
DELETE FROM chronos_messages
WHERE id = ANY(%(ids)s::text[]) AND readied_at IS NULL
  AND xmax <> ALL (ARRAY(SELECT held_xid FROM (/* include: held_sessions */) AS holders))
RETURNING id;

-- name: act_fire_now
-- Due now by the database clock; a deadline already past stays as it is. For a recurring schedule
-- this fires one occurrence now, then the schedule goes on from its expression.
UPDATE chronos_messages SET deadline = least(deadline, %(at)s::timestamptz)
WHERE id = ANY(%(ids)s::text[]) AND readied_at IS NULL
  AND xmax <> ALL (ARRAY(SELECT held_xid FROM (/* include: held_sessions */) AS holders))
RETURNING id;

-- name: act_reschedule
UPDATE chronos_messages SET deadline = %(at)s::timestamptz
WHERE id = ANY(%(ids)s::text[]) AND readied_at IS NULL
  AND xmax <> ALL (ARRAY(SELECT held_xid FROM (/* include: held_sessions */) AS holders))
RETURNING id;

-- name: present_ids
-- Which of these ids exist, and whether a firer holds them (for the actions' report): stamped as
-- claimed, or taken by a firer's claim that deletes whose transaction is open (held_sessions).
SELECT id, readied_at IS NOT NULL OR xmax = ANY (ARRAY(SELECT held_xid FROM (/* include: held_sessions */) AS holders))
FROM chronos_messages WHERE id = ANY(%(ids)s::text[]);

-- name: count_action
INSERT INTO chronos_actions (action, actions, messages, last_at)
VALUES (%(action)s, %(actions)s, %(messages)s, now())
ON CONFLICT (action) DO UPDATE SET actions = chronos_actions.actions + EXCLUDED.actions,
    messages = chronos_actions.messages + EXCLUDED.messages, last_at = now();

-- name: action_totals
SELECT action, actions, messages FROM chronos_actions ORDER BY action;

-- name: server_self
-- The server a store is connected to as it sees itself, for `chronos status` and the console
-- (Store.server_view, with server_standbys and chronos_sessions, which read shared memory, no table):
-- its address (NULL over a Unix socket), standby or not, its version.
SELECT now(), host(inet_server_addr()), inet_server_port(), pg_is_in_recovery(), current_setting('server_version');

-- name: server_standbys
-- The servers replicating from this one. A role without pg_read_all_stats sees each one's row and
-- application_name, every other column NULL.
SELECT application_name, CASE WHEN client_port = -1 THEN 'local' ELSE host(client_addr) END, state, sync_state
FROM pg_stat_replication
ORDER BY application_name, pid;

-- name: chronos_sessions
-- The sessions of the Chronos processes on this database, per process: their application_name is
-- 'chronos ROLE NODE' (store.application_name). client_port is -1 over a Unix socket; it,
-- backend_start and backend_type are NULL in the sessions of another role unless this one has
-- pg_read_all_stats (a parallel worker, whose application_name is its leader's, is one of those then).
SELECT split_part(application_name, ' ', 2) AS role, split_part(application_name, ' ', 3) AS node, count(*),
       coalesce(array_agg(DISTINCT CASE WHEN client_port = -1 THEN 'local' ELSE host(client_addr) END)
                FILTER (WHERE client_port IS NOT NULL), '{}'),
       min(backend_start), bool_and(backend_start IS NOT NULL)
FROM pg_stat_activity
WHERE datname = current_database() AND coalesce(backend_type, 'client backend') = 'client backend'
  AND application_name ~ '^chronos [a-z]+ [0-9a-f-]{36}$'
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: announce_process
-- A process says where it serves /metrics (chronos_processes), and rows not renewed for a day go.
WITH gone AS (
    DELETE FROM chronos_processes WHERE seen_at < now() - interval '1 day'
)
INSERT INTO chronos_processes (node, role, metrics_url, seen_at) VALUES (%(node)s, %(role)s, %(url)s, now())
ON CONFLICT (node) DO UPDATE SET role = EXCLUDED.role, metrics_url = EXCLUDED.metrics_url, seen_at = now();

-- name: withdraw_process
DELETE FROM chronos_processes WHERE node = %(node)s;

-- name: has_processes
SELECT to_regclass('chronos_processes');

-- name: gauge_reader
-- The detector that reads the store gauges (overview_*) for every detector of this database: the first by node
-- of those that said where they serve /metrics lately. The others read none: the same counts again.
SELECT node FROM chronos_processes
WHERE role = 'detector' AND seen_at > now() - %(within_ms)s * interval '1 millisecond'
ORDER BY node LIMIT 1;

-- name: announced_processes
-- The processes that said where they serve /metrics within the last `within_ms`, and how long ago.
SELECT role, node, metrics_url, extract(epoch FROM now() - seen_at)::float8 FROM chronos_processes
WHERE seen_at > now() - %(within_ms)s * interval '1 millisecond'
ORDER BY role, metrics_url;

-- name: db_now
SELECT now();

-- Fire-rate limits (chronos/domain/ratelimit.py): used only when a limit is configured.

-- name: waiting_topics
-- The destination topics named by waiting rows (chronosTopic), one index probe per topic: a
-- skip scan of the topic index instead of reading every waiting row.
WITH RECURSIVE t(topic) AS (
    (SELECT topic FROM chronos_messages WHERE topic IS NOT NULL AND readied_at IS NULL ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT m.topic FROM chronos_messages AS m
            WHERE m.topic > t.topic AND m.readied_at IS NULL ORDER BY m.topic LIMIT 1)
    FROM t WHERE t.topic IS NOT NULL
)
SELECT topic FROM t WHERE topic IS NOT NULL;

-- name: take_tokens
-- Refill the bucket of a topic for the time since its last refill (database clock) and lock it
-- until this transaction ends: a peer's take waits, then sees what this one spent. No row (and no
-- write) while none of the topic's rows is due. A firer whose transaction started before the last
-- refill adds nothing (greatest(0, ...)). `take_tokens` (a topic named by chronosTopic) and
-- `take_output_tokens` (the output topic: rows without chronosTopic, its bucket named %(topic)s)
-- put their topic filter at the mark.
INSERT INTO chronos_rate_limits AS b (topic, rate, tokens, refilled_at)
SELECT %(topic)s, %(rate)s, %(capacity)s, now()
WHERE EXISTS (SELECT FROM chronos_messages
              WHERE readied_at IS NULL AND cron IS NULL /* topic filter */ AND deadline <= now())
ON CONFLICT (topic) DO UPDATE SET
    rate = EXCLUDED.rate,
    tokens = least(%(capacity)s::float8,
                   b.tokens + %(rate)s::float8 * greatest(0, extract(epoch FROM now() - b.refilled_at))::float8),
    refilled_at = greatest(b.refilled_at, now())
RETURNING tokens;

-- name: spend_tokens
UPDATE chronos_rate_limits SET tokens = tokens - %(spent)s WHERE topic = %(topic)s;

-- name: return_tokens
-- Tokens a firer's claim that deletes set aside (take_tokens, spend_tokens: a transaction of their own) and
-- did not use, given back, up to what the bucket holds at most.
UPDATE chronos_rate_limits SET tokens = least(tokens + %(count)s, %(capacity)s::float8) WHERE topic = %(topic)s;

-- name: limited_topics
-- Topics the firers applied a limit to within the last minute (they take tokens every poll while
-- the topic has due rows; a bucket left by a limit since removed drops out).
SELECT topic, rate FROM chronos_rate_limits WHERE refilled_at > now() - interval '1 minute' ORDER BY topic;

-- name: throttled_topic
-- Due rows of a limited topic no firer claimed yet (at most %(cap)s counted), and the oldest deadline.
SELECT count(*), min(deadline) FROM (
    SELECT deadline FROM chronos_messages
    WHERE readied_at IS NULL AND cron IS NULL AND topic = %(topic)s AND deadline <= now()
      AND xmax <> ALL (ARRAY(SELECT held_xid FROM (/* include: held_sessions */) AS holders))
    LIMIT %(cap)s) AS due;

-- name: throttled_output_topic
SELECT count(*), min(deadline) FROM (
    SELECT deadline FROM chronos_messages
    WHERE readied_at IS NULL AND cron IS NULL AND topic IS NULL AND deadline <= now()
      AND xmax <> ALL (ARRAY(SELECT held_xid FROM (/* include: held_sessions */) AS holders))
    LIMIT %(cap)s) AS due;

-- Cells (chronos/domain/cells.py): the input partitions this database's cell owns.

-- name: has_cell_partitions
SELECT to_regclass('chronos_cell_partitions');

-- name: cell_partitions
SELECT partition, epoch, state FROM chronos_cell_partitions ORDER BY partition;

-- name: cell_fence
-- The last statement of a consumer's write to this cell: the rows of the partitions it wrote, as they are
-- now, locked to the end of its transaction (FOR SHARE also takes a ROW SHARE lock on the table, which a
-- change of the map waits for; a change committed while this statement waited for it is seen here).
SELECT partition, epoch, state FROM chronos_cell_partitions WHERE partition = ANY(%(partitions)s) FOR SHARE;

-- name: cell_fence_whole
-- The same for the one cell of a map that lists nothing: whether the list is still empty.
SELECT partition, epoch, state FROM chronos_cell_partitions LIMIT 1 FOR SHARE;

-- name: cell_map_lock
-- Every change of the map first waits for the writes that checked their fence (cell_fence) to end, and
-- holds off those that have not, until it commits.
LOCK TABLE chronos_cell_partitions IN EXCLUSIVE MODE;

-- name: open_cell_partitions
-- Open partitions in this cell at an epoch: a partition it lists already at this epoch or a higher one
-- is left as it is (and not returned).
INSERT INTO chronos_cell_partitions AS c (partition, epoch, state)
SELECT p, %(epoch)s, 'open' FROM unnest(%(partitions)s::int[]) AS p
ON CONFLICT (partition) DO UPDATE SET epoch = EXCLUDED.epoch, state = 'open' WHERE c.epoch < EXCLUDED.epoch
RETURNING partition;

-- name: close_cell_partitions
-- Partitions on their way to another cell: each one's epoch raised, so that no write fenced at the one
-- before goes through, and nothing written to it until another cell opens it at a higher epoch.
UPDATE chronos_cell_partitions SET state = 'moving', epoch = epoch + 1 WHERE partition = ANY(%(partitions)s)
RETURNING partition, epoch;

-- name: has_consumer_reach
SELECT to_regclass('chronos_consumer_reach');

-- name: note_reach
-- A consumer says which cells it reached, each so many milliseconds ago (its rows made or renewed, never moved
-- back), the rows not renewed for a day dropped; and reads, for each cell, how many milliseconds ago another
-- consumer of its group last said it reached it.
WITH noted AS (
    INSERT INTO chronos_consumer_reach AS r (consumer_group, node, cell, reached_at)
    SELECT %(group)s, %(node)s, c.cell, now() - c.ms * interval '1 millisecond'
    FROM unnest(%(cells)s::text[], %(ms)s::bigint[]) AS c(cell, ms)
    ON CONFLICT (consumer_group, node, cell) DO UPDATE SET reached_at = greatest(r.reached_at, EXCLUDED.reached_at)
), gone AS (
    DELETE FROM chronos_consumer_reach WHERE reached_at < now() - interval '1 day'
)
SELECT cell, (extract(epoch FROM now() - max(reached_at)) * 1000)::bigint FROM chronos_consumer_reach
WHERE consumer_group = %(group)s AND node <> %(node)s AND reached_at >= now() - interval '1 day'
GROUP BY cell ORDER BY cell;

-- Moves of input partitions between cells (chronos/domain/moves.py, chronos/ops/moves.py): run by `chronos cells
-- move` as the databases' owner. The source cell's statements first, then the target's. Rows of a partition
-- are found by walking the table's blocks (a TID range scan: no index of the partition costs the consumer's
-- writes anything), or among the few due soon off the due index.

-- fragment: moving_columns
-- A row as a move carries it (chronos.domain.moves.MovingRow), times in epoch microseconds.
id, (extract(epoch FROM deadline) * 1000000)::bigint, topic, key, value, headers, ordering_key, input_partition,
cron, timezone, dst_policy, seq, (extract(epoch FROM enqueued_at) * 1000000)::bigint, attempts, last_error,
(extract(epoch FROM original_deadline) * 1000000)::bigint, (extract(epoch FROM last_occurrence) * 1000000)::bigint

-- name: has_cell_moves
SELECT to_regclass('chronos_cell_moves');

-- name: move_records
SELECT partition, target, step, cursor, (extract(epoch FROM horizon) * 1000000)::bigint, node,
       (extract(epoch FROM now() - seen_at) * 1000)::bigint
FROM chronos_cell_moves ORDER BY partition;

-- name: move_begin
-- A move recorded, its copy to start at the first block, its lease this node's; one recorded already is left.
INSERT INTO chronos_cell_moves (partition, target, step, horizon, node, seen_at)
VALUES (%(partition)s, %(target)s, 'copying', now() + %(ahead_ms)s * interval '1 millisecond', %(node)s, now())
ON CONFLICT (partition) DO NOTHING;

-- name: move_lease
-- The move's lease taken or renewed by this node: when it holds it, or the holder's is older than lease_ms.
UPDATE chronos_cell_moves SET node = %(node)s, seen_at = now()
WHERE partition = %(partition)s AND (node = %(node)s OR seen_at < now() - %(lease_ms)s * interval '1 millisecond')
RETURNING partition;

-- name: move_save
UPDATE chronos_cell_moves SET step = %(step)s, cursor = %(cursor)s, seen_at = now()
WHERE partition = %(partition)s AND node = %(node)s
RETURNING partition;

-- name: move_end
-- The move done: its record, what it noted and held gone.
WITH changes AS (
    DELETE FROM chronos_cell_move_changes WHERE partition = %(partition)s
), outbox AS (
    DELETE FROM chronos_cell_move_outbox WHERE input_partition = %(partition)s
)
DELETE FROM chronos_cell_moves WHERE partition = %(partition)s;

-- name: move_lock_timeout
-- The move's changes of the table's triggers wait at most this long for its lock, then give up (and are tried
-- again): every write waits behind a lock being waited for.
SELECT set_config('lock_timeout', %(ms)s::text || 'ms', true);

-- The table's lock a change of its triggers takes (CREATE TRIGGER's, DROP TRIGGER's), first: `_now` if it is
-- free at once, else not at all (a request that waits holds every later one behind it, writes and reads).

-- name: move_lock_to_make
LOCK TABLE chronos_messages IN SHARE ROW EXCLUSIVE MODE;

-- name: move_lock_to_make_now
LOCK TABLE chronos_messages IN SHARE ROW EXCLUSIVE MODE NOWAIT;

-- name: move_lock_to_drop
LOCK TABLE chronos_messages IN ACCESS EXCLUSIVE MODE;

-- name: move_lock_to_drop_now
LOCK TABLE chronos_messages IN ACCESS EXCLUSIVE MODE NOWAIT;

-- name: move_by_itself
-- The statements of this transaction are the move's own: not noted, not held back by a freeze.
SELECT set_config('chronos.moving', 'on', true);

-- The watch on a moving partition and its freeze: triggers on the table, for the partition named (an integer
-- put in by the store, not bound). WHEN keeps the other partitions' writes from calling the function.

-- name: move_watch_inserts
CREATE OR REPLACE TRIGGER chronos_move_{partition}_inserts AFTER INSERT ON chronos_messages FOR EACH ROW
WHEN (NEW.input_partition = {partition}) EXECUTE FUNCTION chronos_cell_move_note('{partition}');

-- name: move_watch_updates
CREATE OR REPLACE TRIGGER chronos_move_{partition}_updates AFTER UPDATE ON chronos_messages FOR EACH ROW
WHEN (OLD.input_partition = {partition} OR NEW.input_partition = {partition})
EXECUTE FUNCTION chronos_cell_move_note('{partition}');

-- name: move_watch_deletes
CREATE OR REPLACE TRIGGER chronos_move_{partition}_deletes AFTER DELETE ON chronos_messages FOR EACH ROW
WHEN (OLD.input_partition = {partition}) EXECUTE FUNCTION chronos_cell_move_note('{partition}');

-- name: move_freeze
CREATE OR REPLACE TRIGGER chronos_move_{partition}_freeze BEFORE UPDATE OR DELETE ON chronos_messages FOR EACH ROW
WHEN (OLD.input_partition = {partition}) EXECUTE FUNCTION chronos_cell_move_freeze();

-- name: move_has_freeze
-- Whether the partition's freeze is on the table (made with its watch, armed once the map closes the partition).
SELECT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'chronos_messages'::regclass AND tgname = %(name)s);

-- name: move_unwatch
-- One trigger of the partition's watch or freeze dropped: `{trigger}` is inserts, updates, deletes or freeze.
DROP TRIGGER IF EXISTS chronos_move_{partition}_{trigger} ON chronos_messages;

-- name: move_close
-- The partition closed in its cell at its epoch + 1, unless it is closed already; its epoch either way.
WITH closed AS (
    UPDATE chronos_cell_partitions SET state = 'moving', epoch = epoch + 1
    WHERE partition = %(partition)s AND state = 'open'
    RETURNING epoch
)
SELECT epoch FROM closed
UNION ALL
SELECT epoch FROM chronos_cell_partitions WHERE partition = %(partition)s AND NOT EXISTS (SELECT FROM closed);

-- name: move_blocks
-- How many blocks the table has now (the copy walks them up to there), and how many rows a block holds as the
-- table was last vacuumed or analysed (NULL before).
SELECT pg_relation_size('chronos_messages') / current_setting('block_size')::bigint,
       (SELECT CASE WHEN reltuples > 0 AND relpages > 0 THEN reltuples / relpages END
        FROM pg_class WHERE oid = 'chronos_messages'::regclass);

-- name: move_scan
-- The rows of the partition in a range of the table's blocks due after the horizon (recurring schedules go at
-- the cut-over): what the copy carries ahead.
SELECT /* include: moving_columns */
FROM chronos_messages
WHERE ctid >= %(first)s::tid AND ctid < %(last)s::tid
  AND input_partition = %(partition)s AND cron IS NULL AND deadline > %(after)s::timestamptz;

-- name: move_changes
-- The rows of the partition noted since, oldest change first, each as it stands now (none: deleted, or now
-- another partition's).
SELECT c.id, c.n, m.*
FROM chronos_cell_move_changes AS c
LEFT JOIN LATERAL (SELECT /* include: moving_columns */
                   FROM chronos_messages WHERE id = c.id AND input_partition = c.partition) AS m ON true
WHERE c.partition = %(partition)s
ORDER BY c.n
LIMIT %(limit)s;

-- name: move_forget
-- Changes carried over, forgotten unless noted again meanwhile. A change a write is noting again right now (its
-- transaction holds the change's row) is left, to carry again: the move never waits for a write here, and a write
-- noting several rows in its own order and this in another would each wait for the other (a deadlock).
DELETE FROM chronos_cell_move_changes AS c
WHERE (c.partition, c.id) IN (
    SELECT l.partition, l.id
    FROM chronos_cell_move_changes AS l
    JOIN unnest(%(ids)s::text[], %(ns)s::bigint[]) AS f(id, n) ON l.id = f.id AND l.n = f.n
    WHERE l.partition = %(partition)s
    FOR UPDATE OF l SKIP LOCKED);

-- name: move_in_flight
-- Rows of the partition a firer of this cell holds: stamped as claimed (the rows a move copied into it are held
-- far later), or taken by a firer's claim that deletes whose transaction is still open (held_sessions: the row
-- still here to this statement, gone once it commits, back if it rolls back), looked for among the rows due up to
-- `until` off the due index (a firer takes rows due within its lookahead, less than half the hold time).
SELECT (SELECT count(*) FROM chronos_messages
        WHERE readied_at IS NOT NULL AND readied_at < %(dormant_from)s::timestamptz AND input_partition = %(partition)s)
     + (SELECT count(*) FROM chronos_messages
        WHERE readied_at IS NULL AND cron IS NULL AND deadline <= %(until)s::timestamptz
          AND input_partition = %(partition)s
          AND xmax = ANY (ARRAY(SELECT held_xid FROM (/* include: held_sessions */) AS holders)));

-- name: move_near
-- The partition's rows waiting here due up to `until`, off the due index, locked for their hand-over (after
-- move_by_itself): not those a firer's claim that deletes holds (move_in_flight), which the cut-over waits for
-- apart, and which handed over could be fired by both cells once their firer commits. The lock waits only for
-- a statement under way that changes one of them (a claim begun before the freeze, a firer's take): a row it
-- took or stamped meanwhile is left out, as it stands once that statement's transaction ends.
SELECT /* include: moving_columns */
FROM chronos_messages
WHERE readied_at IS NULL AND cron IS NULL AND deadline <= %(until)s::timestamptz AND input_partition = %(partition)s
  AND xmax <> ALL (ARRAY(SELECT held_xid FROM (/* include: held_sessions */) AS holders))
ORDER BY deadline, seq
LIMIT %(limit)s
FOR UPDATE;

-- name: move_take
-- Rows handed over live to the cell the partition goes to, gone from here, in move_near's transaction, once the
-- cell they go to has them: locked since, no firer took one meanwhile.
DELETE FROM chronos_messages
WHERE id = ANY(%(ids)s::text[]) AND input_partition = %(partition)s AND readied_at IS NULL;

-- name: move_ship_schedules
-- The partition's recurring schedules taken out of the table into the outbox, in one statement (after
-- move_by_itself): held by neither cell until the target has them.
WITH shipped AS (
    DELETE FROM chronos_messages WHERE cron IS NOT NULL AND input_partition = %(partition)s
    RETURNING id, deadline, readied_at, readied_by, topic, key, value, headers, ordering_key, enqueued_at, seq, cron,
              timezone, attempts, last_error, original_deadline, last_occurrence, dst_policy, input_partition
)
INSERT INTO chronos_cell_move_outbox (id, deadline, readied_at, readied_by, topic, key, value, headers,
                                      ordering_key, enqueued_at, seq, cron, timezone, attempts, last_error,
                                      original_deadline, last_occurrence, dst_policy, input_partition)
SELECT * FROM shipped;

-- name: move_outbox
SELECT /* include: moving_columns */
FROM chronos_cell_move_outbox WHERE input_partition = %(partition)s;

-- name: move_outbox_done
DELETE FROM chronos_cell_move_outbox WHERE input_partition = %(partition)s;

-- name: move_drop_due
-- The source's own copies of the partition's rows due up to `until`, deleted (after move_by_itself): once the
-- target owns them they are frozen here, and would stand at the head of the due index before the others'.
DELETE FROM chronos_messages
WHERE ctid = ANY(ARRAY(SELECT ctid FROM chronos_messages
                       WHERE readied_at IS NULL AND cron IS NULL AND deadline <= %(until)s::timestamptz
                         AND input_partition = %(partition)s
                       LIMIT %(limit)s));

-- name: move_drop_scan
-- The source's own copies of the partition's rows in a range of blocks, deleted (after move_by_itself).
DELETE FROM chronos_messages
WHERE ctid >= %(first)s::tid AND ctid < %(last)s::tid AND input_partition = %(partition)s;

-- name: move_seq
-- Where the table's enqueue order stands: the target's goes on from past it.
SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('chronos_messages', 'seq')::regclass), 0);

-- name: move_seq_at_least
SELECT setval(pg_get_serial_sequence('chronos_messages', 'seq'), %(seq)s::bigint)
WHERE coalesce(pg_sequence_last_value(pg_get_serial_sequence('chronos_messages', 'seq')::regclass), 0)
      < %(seq)s::bigint;

-- name: create_move_rows
-- The rows a move writes into the target, staged for one transaction.
CREATE TEMP TABLE IF NOT EXISTS chronos_move_rows (
    id text, deadline_us bigint, topic text, key bytea, value bytea, headers bytea, ordering_key text,
    input_partition integer, cron text, timezone text, dst_policy text, seq bigint, enqueued_us bigint,
    attempts integer, last_error text, original_deadline_us bigint, last_occurrence_us bigint, readied_us bigint
) ON COMMIT DROP;

-- name: copy_move_rows
COPY chronos_move_rows FROM STDIN (FORMAT BINARY);

-- name: move_put
-- The staged rows into the target's table: dormant (held by the move, claimed at their mark `readied_us`: see
-- chronos.domain.moves), or live (no mark). A row of the id already here is overwritten only if it is one the
-- move put there dormant: a message the target holds of its own is kept. The enqueue order (seq) is the
-- source's. Epoch microseconds to timestamptz as insert_from_staging does it (exact).
INSERT INTO chronos_messages AS m (id, deadline, topic, key, value, headers, ordering_key, input_partition, cron,
                                   timezone, dst_policy, seq, enqueued_at, attempts, last_error, original_deadline,
                                   last_occurrence, readied_at, readied_by)
OVERRIDING SYSTEM VALUE
SELECT id, timestamptz 'epoch' + (deadline_us / 1000000) * interval '1 second'
               + mod(deadline_us, 1000000) * interval '1 microsecond',
       topic, key, value, headers, ordering_key, input_partition, cron, timezone, dst_policy, seq,
       timestamptz 'epoch' + (enqueued_us / 1000000) * interval '1 second'
           + mod(enqueued_us, 1000000) * interval '1 microsecond',
       attempts, last_error,
       timestamptz 'epoch' + (original_deadline_us / 1000000) * interval '1 second'
           + mod(original_deadline_us, 1000000) * interval '1 microsecond',
       timestamptz 'epoch' + (last_occurrence_us / 1000000) * interval '1 second'
           + mod(last_occurrence_us, 1000000) * interval '1 microsecond',
       timestamptz 'epoch' + (readied_us / 1000000) * interval '1 second'
           + mod(readied_us, 1000000) * interval '1 microsecond',
       CASE WHEN readied_us IS NOT NULL THEN %(node)s::uuid END
FROM chronos_move_rows
ON CONFLICT (id) DO UPDATE SET
    deadline = EXCLUDED.deadline, topic = EXCLUDED.topic, key = EXCLUDED.key, value = EXCLUDED.value,
    headers = EXCLUDED.headers, ordering_key = EXCLUDED.ordering_key, input_partition = EXCLUDED.input_partition,
    cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, dst_policy = EXCLUDED.dst_policy,
    enqueued_at = EXCLUDED.enqueued_at, attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error,
    original_deadline = EXCLUDED.original_deadline, last_occurrence = EXCLUDED.last_occurrence,
    readied_at = EXCLUDED.readied_at, readied_by = EXCLUDED.readied_by
WHERE m.readied_by = %(node)s::uuid;

-- name: move_drop_copies
-- Dormant copies of rows the source no longer holds in the partition.
DELETE FROM chronos_messages WHERE id = ANY(%(ids)s::text[]) AND readied_by = %(node)s::uuid;

-- name: move_wake
-- The partition's dormant rows due up to `until` (its mark), made waiting, deadline first, a batch at a time,
-- from `from` on: how many, and the last one's mark, where the next batch starts. The rows woken before stay in
-- the in-flight index until vacuum, so a batch that started from the first mark again would walk over them all.
WITH picked AS MATERIALIZED (
    SELECT ctid, readied_at FROM chronos_messages
    WHERE readied_at >= %(from)s::timestamptz AND readied_at <= %(until)s::timestamptz
      AND readied_by = %(node)s::uuid AND input_partition = %(partition)s
    ORDER BY readied_at
    LIMIT %(limit)s
), woken AS (
    UPDATE chronos_messages SET readied_at = NULL, readied_by = NULL
    WHERE ctid = ANY(ARRAY(SELECT ctid FROM picked)) AND readied_by = %(node)s::uuid
    RETURNING 1
)
SELECT (SELECT count(*) FROM woken),
       (SELECT max(readied_at) FROM picked);

-- name: live_firers
-- The firers of this cell whose lease is younger than the hold time.
SELECT count(*) FROM chronos_firers WHERE seen_at > now() - %(hold_ms)s * interval '1 millisecond';

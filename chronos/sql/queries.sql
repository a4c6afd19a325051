-- All SQL the processes run, one statement per `-- name: x` block.

-- name: schema_version
SELECT coalesce(max(version), 0) FROM chronos_schema_version;

-- name: create_staging
-- op: 'i' insert unless the id is waiting, 'u' insert or replace; ord keeps the input order.
CREATE TEMP TABLE IF NOT EXISTS chronos_staging (
    id text, deadline_us bigint, topic text, key bytea, value bytea, headers bytea, ordering_key text,
    cron text, timezone text, op text NOT NULL DEFAULT 'i', ord bigint GENERATED ALWAYS AS IDENTITY
) ON COMMIT DELETE ROWS;

-- name: copy_staging
COPY chronos_staging (id, deadline_us, topic, key, value, headers, ordering_key) FROM STDIN (FORMAT BINARY);

-- name: insert_from_staging
INSERT INTO chronos_messages (id, deadline, topic, key, value, headers, ordering_key, cron, timezone)
SELECT id, timestamptz 'epoch' + deadline_us * interval '1 microsecond', topic, key, value, headers, ordering_key,
       cron, timezone
FROM chronos_staging
WHERE op = 'i'
ORDER BY ord
ON CONFLICT (id) DO NOTHING;

-- name: copy_staging_full
COPY chronos_staging (id, deadline_us, topic, key, value, headers, ordering_key, cron, timezone, op)
FROM STDIN (FORMAT BINARY);

-- name: upsert_from_staging
-- chronosAction: replace. A replaced row that a firer holds is handed back, so the new version
-- fires (the firer's delete then finds the row changed and leaves it).
INSERT INTO chronos_messages (id, deadline, topic, key, value, headers, ordering_key, cron, timezone)
SELECT id, timestamptz 'epoch' + deadline_us * interval '1 microsecond', topic, key, value, headers, ordering_key,
       cron, timezone
FROM chronos_staging
WHERE op = 'u'
ORDER BY ord
ON CONFLICT (id) DO UPDATE SET
    deadline = EXCLUDED.deadline, topic = EXCLUDED.topic, key = EXCLUDED.key, value = EXCLUDED.value,
    headers = EXCLUDED.headers, ordering_key = EXCLUDED.ordering_key, cron = EXCLUDED.cron,
    timezone = EXCLUDED.timezone, readied_at = NULL, readied_by = NULL, enqueued_at = now();

-- name: cancel
DELETE FROM chronos_messages WHERE id = ANY(%(ids)s);

-- name: waiting_ids
SELECT id FROM chronos_messages WHERE id = ANY(%(ids)s);

-- name: hot_path_settings
-- For the firer's, consumer's and detector's own connections. Their statements reach rows through
-- an index condition or by TID; with sequential and bitmap scans disabled, no statistics (a table
-- analyzed while empty, a generic plan cached then, a bloated or huge table) can make the planner
-- prefer a plan that reads the whole table, since PostgreSQL picks the plan with the fewest
-- disabled nodes before comparing costs. (Where a statement has no other way, the scan still runs.)
SELECT set_config('enable_seqscan', 'off', false), set_config('enable_bitmapscan', 'off', false);

-- name: claim
-- A row with an ordering key is claimable only if every earlier row of its key (by deadline,
-- then enqueue order) is claimed by this same statement: a row held by a peer, locked by a
-- concurrent claim (skipped) or still waiting holds back the later rows of its key only. That is
-- checked without comparing rows with each other: a candidate is held back when a row of its key
-- lies between it and the candidate before it of the same key (one index range probe each), and
-- so is every later candidate of that key. Rows are updated by TID (the CTE's ctid): with no
-- usable index path the planner can only reach them one by one.
WITH candidates AS MATERIALIZED (
    SELECT ctid, ordering_key, deadline, seq FROM chronos_messages
    WHERE readied_at IS NULL AND cron IS NULL
      -- now(), not clock_timestamp(): a stable bound is an index condition, so the scan stops at
      -- the first row not yet due instead of filtering every far-future row (autocommit: now() is
      -- this statement's start)
      AND deadline <= now() + %(lookahead_ms)s * interval '1 millisecond'
    ORDER BY deadline, seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), keyed AS (
    SELECT ctid, ordering_key, deadline, seq,
           lag(deadline, 1, '-infinity') OVER w AS prev_deadline, lag(seq, 1, 0::bigint) OVER w AS prev_seq
    FROM candidates
    WHERE ordering_key IS NOT NULL
    WINDOW w AS (PARTITION BY ordering_key ORDER BY deadline, seq)
), held AS (
    SELECT ctid, bool_or(EXISTS (
               SELECT FROM chronos_messages AS e
               WHERE e.ordering_key = k.ordering_key AND e.cron IS NULL
                 AND (e.deadline, e.seq) > (k.prev_deadline, k.prev_seq)
                 AND (e.deadline, e.seq) < (k.deadline, k.seq)))
           OVER (PARTITION BY ordering_key ORDER BY deadline, seq) AS held
    FROM keyed AS k
), due AS (
    SELECT ctid FROM candidates WHERE ordering_key IS NULL
    UNION ALL
    SELECT ctid FROM held WHERE NOT held
)
UPDATE chronos_messages AS m
SET readied_at = now(), readied_by = %(node)s
FROM due
WHERE m.ctid = due.ctid
RETURNING m.id, (extract(epoch FROM m.deadline) * 1000000)::bigint, m.topic, m.key, m.value, m.headers,
          m.readied_at, m.seq, m.ctid;

-- name: due_schedules
SELECT id, (extract(epoch FROM deadline) * 1000000)::bigint, cron, timezone, topic, key, value, headers,
       ordering_key
FROM chronos_messages
WHERE cron IS NOT NULL AND deadline <= now() + %(lookahead_ms)s * interval '1 millisecond'
ORDER BY deadline
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: insert_occurrence
-- One occurrence of a recurring schedule, created already claimed by this firer.
INSERT INTO chronos_messages (id, deadline, topic, key, value, headers, ordering_key, readied_at, readied_by)
VALUES (%(id)s, timestamptz 'epoch' + %(deadline_us)s * interval '1 microsecond', %(topic)s, %(key)s, %(value)s,
        %(headers)s, %(ordering_key)s, now(), %(node)s)
ON CONFLICT (id) DO NOTHING
RETURNING id, (extract(epoch FROM deadline) * 1000000)::bigint, topic, key, value, headers, readied_at, seq, ctid;

-- name: advance_schedule
UPDATE chronos_messages SET deadline = timestamptz 'epoch' + %(next_us)s * interval '1 microsecond'
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

-- name: db_clock
SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;

-- name: overview_features
-- What this schema holds, for `chronos status`: recurring schedules as rows with a `cron` column,
-- or a `chronos_schedules` table; and the planner's row estimate (-1 before the first ANALYZE).
SELECT EXISTS (SELECT FROM pg_attribute
               WHERE attrelid = 'chronos_messages'::regclass AND attname = 'cron' AND NOT attisdropped),
       to_regclass('chronos_schedules') IS NOT NULL,
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

-- name: count_schedules_table
SELECT count(*) FROM chronos_schedules;

"""The named SQL statements of `sql/queries.sql`, loaded once into `QUERIES`.

Each statement sits under a `-- name: x` header; a `-- fragment: x` is a piece of SQL several statements
share, put where they say `/* include: x */`. Statements that differ from another only in their topic
filter (or the claim's window of recent deadlines) are one body with the filter's place marked, made into
one statement per filter here (`TOPIC_VARIANTS`); and each claim has a twin that picks its rows for the claim
that deletes (`PICKS`: without the claim's lock, without the rows firers hold, ending with `pick_rows`).
"""

from __future__ import annotations

import re
from importlib import resources

from chronos.domain.model import Mark
from chronos.domain.shares import slice_span

SQL_DIR = resources.files("chronos.adapters.postgres.sql")
_NAME_RE = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_INCLUDE_RE = re.compile(r"/\* include: (\w+) \*/")

# The claim and the token bucket's refill, for any topic, for one topic named by chronosTopic, and for the
# output topic (rows without one); and the claim of recent deadlines.
TOPIC_MARK = "/* topic filter */"
LAST_SEQ_VERSION = 18  # the schema from which chronos_last_seq() reads the messages' sequence
# The claim of a firer's own slices (chronos.domain.shares.slice_span): the slices from %(low)s to %(high)s whose
# bits %(mask)s sets. The range is the due index's last column (migration 20): a row of a slice outside it is
# passed over in the index, without a visit to the table, and a firer's own slices are one range (slices_of); the
# mask leaves out the slices of a range that are not the claim's (the slices of others that a firer takes once
# overdue need not be one range). A key's rows are all in one slice, so the ordering check is the claim's.
OWN_SLICES = ("AND (hashtext(coalesce(ordering_key, id)) & 15) BETWEEN %(low)s::int AND %(high)s::int "
              "AND ((1 << (hashtext(coalesce(ordering_key, id)) & 15)) & %(mask)s::int) <> 0")
TOPIC_VARIANTS = {  # statement: (body, the filter put at its mark)
    "claim": ("claim", ""),
    # the claim of recent deadlines only: see `Claimer.claim_rows`
    "claim_recent": ("claim", "AND deadline >= now() - %(window_ms)s * interval '1 millisecond'"),
    "claim_topic": ("claim", "AND topic = %(topic)s"),
    # the claim that starts where the last one ended: see `ClaimCursor`
    "claim_after": ("claim_after", ""),
    # a firer's claim of its own slices (chronos.domain.shares): each of the three within them
    "claim_share": ("claim", OWN_SLICES),
    "claim_share_recent": ("claim", f"{OWN_SLICES} AND deadline >= now() - %(window_ms)s * interval '1 millisecond'"),
    "claim_share_after": ("claim_after", OWN_SLICES),
    "claim_output_topic": ("claim", "AND topic IS NULL"),
    "take_tokens": ("take_tokens", "AND topic = %(topic)s"),
    "take_output_tokens": ("take_tokens", "AND topic IS NULL"),
}
# The claim that deletes (CHRONOS_FIRER_CLAIM=delete) picks each claim's rows with the claim's twin: its row lock
# dropped, the rows firers hold (`held_xids`, read before the pick) and those of a partition moving to another cell
# (`not_moving`, from schema version 12 on) left out at its topic filter's mark, and `pick_rows` in place of
# `claim_rows` (and of what follows it).
PICKS = {"pick": "claim", "pick_recent": "claim_recent", "pick_after": "claim_after", "pick_topic": "claim_topic",
         "pick_output_topic": "claim_output_topic", "pick_share": "claim_share", "pick_share_recent": "claim_share_recent",
         "pick_share_after": "claim_share_after"}
LOCK = "FOR UPDATE SKIP LOCKED"


# The consumer's writes and the claim that deletes' takes and put-backs on a schema before the input partition was
# recorded (version 12), which this release's processes run on until `chronos migrate`
# (docs/operations/upgrading.md): the same statements without it.
BEFORE_PARTITION = ("copy_messages", "insert_from_staging", "upsert_from_staging", "take", "restore_taken")
_PARTITION_COLUMN = re.compile(r",\s*(?:[mr]\.)?input_partition(?:\s*=\s*EXCLUDED\.input_partition)?"
                               r"|,\s*%\(input_partitions\)s::int\[\]")


def due_claim(limit: int, lookahead_ms: int, window_ms: int | None, after: Mark | None,
              slices: tuple[int, ...] | None = None) -> tuple[str, dict[str, object]]:
    """The claim of due rows a firer runs (`ports.DueClaims.claim`): "claim", "claim_recent" (`window_ms`) or
    "claim_after" (`after`, below whose mark it looks within `window_ms`), and its parameters; with `slices`, its
    twin within them ("claim_share", "claim_share_recent", "claim_share_after"). Its pick is `PICKS`' twin of
    that name."""
    name = "claim_after" if after is not None else "claim" if window_ms is None else "claim_recent"
    mark = after if after is not None else Mark(0, 0)
    params: dict[str, object] = {"limit": limit, "lookahead_ms": lookahead_ms, "window_ms": window_ms,
                                 "after_us": mark.deadline_us, "after_seq": mark.seq, "since_seq": mark.since_seq}
    if slices is not None:
        name = name.replace("claim", "claim_share", 1)
        params["low"], params["high"], params["mask"] = slice_span(slices)
    return name, params


def before_partition(name: str) -> str:
    """The name of the statement `name` for a schema before version 12."""
    return f"{name}_before_12"


def load(text: str) -> dict[str, str]:
    """The statements of a queries.sql text by name, fragments put in and topic variants made."""
    parts = _NAME_RE.split(text)
    blocks = {(kind, name): body.strip().rstrip(";") for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3])}
    fragments = {name: "\n".join(line for line in body.splitlines() if not line.startswith("--"))
                 for (kind, name), body in blocks.items() if kind == "fragment"}
    queries = {name: _INCLUDE_RE.sub(lambda m: fragments[m.group(1)], body)
               for (kind, name), body in blocks.items() if kind == "name"}
    bodies = {body: queries[body] for body, _ in TOPIC_VARIANTS.values()}
    for name, (body, topic_filter) in TOPIC_VARIANTS.items():
        assert TOPIC_MARK in bodies[body], f"queries.sql: {body} has no {TOPIC_MARK} mark"
        queries[name] = bodies[body].replace(TOPIC_MARK, topic_filter)
    not_moving = fragments["not_moving"]
    for name in BEFORE_PARTITION:
        older = _PARTITION_COLUMN.sub("", queries[name].replace(not_moving, ""))
        code = "\n".join(line for line in older.splitlines() if not line.lstrip().startswith("--"))
        assert "input_partition" not in code and older != queries[name], f"queries.sql: {name} before 12"
        queries[before_partition(name)] = older
    stamp, pick = fragments["claim_rows"], fragments["pick_rows"]
    not_held = "AND xmax <> ALL (%(held)s::xid[])"  # the transactions firers held as the pick began (held_xids)
    for name, claim in PICKS.items():
        body, topic_filter = TOPIC_VARIANTS[claim]
        for variant, moving in ((name, f" {not_moving}"), (before_partition(name), "")):
            statement = bodies[body].replace(TOPIC_MARK, f"{topic_filter} {not_held}{moving}")
            assert statement.count(LOCK) >= 1 and statement.count(stamp) == 1, f"queries.sql: {body} is not a claim"
            queries[variant] = statement.replace(LOCK, "").split(stamp)[0] + pick
    return queries


QUERIES = load((SQL_DIR / "queries.sql").read_text())

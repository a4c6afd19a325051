"""A poll's messages sorted into a batch (`sort_batch`, pure): one final store operation per id, the
late messages to publish now, the invalid ones to dead-letter."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from chronos import codec
from chronos.domain import reasons
from chronos.domain.intake import Decision, Rules, Verdict, decide
from chronos.domain.model import Row
from chronos.ports import InputMessage as Message

log = logging.getLogger("chronos.consumer")

INSERT, REPLACE, CANCEL = "insert", "replace", "cancel"


@dataclass
class Batch:
    """The outcome of sorting one poll's messages; built by `sort_batch`, a pure function.

    `ops` holds one final store operation per id, so that a batch that schedules, replaces
    and cancels the same id has the same effect as those messages applied one by one.
    """

    ops: dict[str, tuple[str, Row | None]] = field(default_factory=dict)
    sources: dict[str, Message] = field(default_factory=dict)  # each stored id's message (headers read again if needed)
    late: list[tuple[Message, codec.Parsed]] = field(default_factory=list)
    # (message, reason, the headers to carry: as read, a name the client cannot produce escaped)
    dead: list[tuple[Message, str, list]] = field(default_factory=list)
    duplicates: int = 0

    def of(self, op: str) -> list:
        return [row if op != CANCEL else mid for mid, (o, row) in self.ops.items() if o == op]

    @property
    def rows(self) -> dict[str, Row]:
        return {mid: row for mid, (op, row) in self.ops.items() if row is not None}


def _row(mid: str, parsed: codec.Parsed, decision: Decision, msg: Message, rules: Rules) -> Row:
    assert decision.deadline_us is not None  # every ENQUEUE and LATE decision has one
    topic = parsed.topic if parsed.topic != rules.output_topic else None
    return Row(mid, decision.deadline_us, topic, msg.key(), msg.value(),
               codec.encode_headers(parsed.headers), parsed.ordering_key, msg.partition(), cron=parsed.cron,
               timezone=parsed.timezone if parsed.cron is not None else None,
               dst_policy=parsed.dst_policy if parsed.cron is not None else None)


def sort_batch(messages: list[Message], now_us: int, rules: Rules) -> Batch:
    """Sort a poll's messages into a `Batch`. Runs of plain messages (valid, neither action nor
    recurrence, to the output topic: nearly all of them) are sorted by `codec.intake` in native
    code; each other message by `_sort_one`, with the same outcome."""
    batch = Batch()
    i, n = 0, len(messages)
    while i < n:
        i, read = codec.intake(messages, i, now_us, rules.timing_advance_us, rules.max_lateness_us,
                               rules.output_topic, batch, Row, INSERT)
        if i < n:
            _sort_one(batch, messages[i], now_us, rules, read)
            i += 1
    return batch


def _sort_one(batch: Batch, msg: Message, now_us: int, rules: Rules,
              read: tuple[list | None, str | None] | Exception | None = None) -> None:
    """Sort one message of a poll into `batch`. `read` is what `codec.read_headers` gave for it (or
    raised), when it was read already: confluent-kafka's conversion of a message's headers crashes
    the process if asked again after it failed."""
    ops = batch.ops
    try:
        if isinstance(read, Exception):
            raise read
        headers, bad_name = read if read is not None else codec.read_headers(msg)
    except Exception as exc:  # noqa: BLE001 - no header content may stop the consumer; this message only
        log.error("could not read the headers of %s/%s/%s (%s: %s); dead-lettering it without them",
                  msg.topic(), msg.partition(), msg.offset(), type(exc).__name__, exc)
        batch.dead.append((msg, f"{reasons.UNREADABLE_HEADERS}: {type(exc).__name__}: {exc}", []))
        return
    headers = headers or []
    if bad_name is not None:
        batch.dead.append((msg, bad_name, headers))
        return
    parsed = codec.parse_headers(headers)
    decision: Decision = decide(parsed, now_us, rules)
    verdict, mid = decision.verdict, parsed.message_id
    if verdict is Verdict.INVALID:
        batch.dead.append((msg, decision.reason or "invalid", headers))
        return
    assert mid is not None  # headers without a valid id are INVALID
    previous = ops.get(mid, (None, None))[0]
    if verdict is Verdict.CANCEL:
        ops[mid] = (CANCEL, None)
    elif verdict is Verdict.LATE:
        if decision.replace:
            ops[mid] = (CANCEL, None)  # the replacement fires now; the waiting version goes
            batch.late.append((msg, parsed))
        elif previous in (INSERT, REPLACE):
            batch.duplicates += 1      # its id is waiting (scheduled earlier in this batch)
        else:
            batch.late.append((msg, parsed))
    elif decision.replace or previous == CANCEL:
        ops[mid] = (REPLACE, _row(mid, parsed, decision, msg, rules))
        batch.sources[mid] = msg
    elif previous in (INSERT, REPLACE):
        batch.duplicates += 1
    else:
        ops[mid] = (INSERT, _row(mid, parsed, decision, msg, rules))
        batch.sources[mid] = msg

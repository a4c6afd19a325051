"""What operators ask of the in-memory database and do to it (`ports.OperatorsStore`: `chronos show`,
`list`, the actions, the console)."""

from __future__ import annotations

from datetime import datetime
from typing import Sequence

from chronos import codec
from chronos.adapters.memory.base import MemoryHandle
from chronos.adapters.memory.database import StoredParked, StoredRow
from chronos.domain import cron
from chronos.domain.model import Announced
from chronos.domain.operators import (ACTIONS, PREVIEW_BYTES, Filters, Listed, Message, ParkedMessage, Position,
                                      Schedule, state_of)


class MemoryOperators(MemoryHandle):
    """The operators' side of the twin."""

    def show(self, message_id: str, *, output_topic: str) -> Message | None:
        """The message or schedule with this id (its value's first PREVIEW_BYTES), or None."""
        def run(now: int) -> Message | None:
            r = self.db.rows.get(message_id)
            if r is None:
                return None
            return Message(id=r.id, state=_state(r), deadline=cron.from_us(r.deadline_us), topic=r.topic or output_topic,
                           key=r.key, headers=codec.decode_headers(r.headers) if r.headers else [],
                           value_size=None if r.value is None else len(r.value),
                           value_preview=b"" if r.value is None else r.value[:PREVIEW_BYTES],
                           ordering_key=r.ordering_key, enqueued_at=cron.from_us(r.enqueued_us), firer=r.readied_by,
                           claimed_at=None if r.readied_us is None else cron.from_us(r.readied_us), cron=r.cron,
                           timezone=(r.timezone or "UTC") if r.cron is not None else None, dst_policy=r.dst_policy,
                           attempts=r.attempts, last_error=r.last_error,
                           original_deadline=None if r.original_deadline_us is None
                           else cron.from_us(r.original_deadline_us))
        return self._run(run)

    def list_messages(self, f: Filters, *, output_topic: str, limit: int, after: Position | None = None,
                      not_at: datetime | None = None) -> list[Listed]:
        """Up to `limit` rows matching `f` after `after`: in (deadline, seq) order, in id order with an id
        prefix (a string's code points: the order of PostgreSQL's C collation, the embedded server's)."""
        bounds = [None if t is None else cron.to_us(t) for t in (f.due_after, f.due_before, not_at)]
        due_after, due_before, not_at_us = bounds

        def matches(r: StoredRow) -> bool:
            return ((f.state is None or _state(r) == f.state)
                    and (due_after is None or r.deadline_us > due_after)
                    and (due_before is None or r.deadline_us < due_before)
                    and (not_at_us is None or r.deadline_us != not_at_us)
                    and (f.topic is None or r.topic == f.topic) and (not f.output_topic or r.topic is None)
                    and (f.key is None or r.key == f.key)
                    and (f.ordering_key is None or r.ordering_key == f.ordering_key)
                    and (f.id_prefix is None or r.id.startswith(f.id_prefix)))

        def run(now: int) -> list[Listed]:
            found = [r for r in self.db.rows.values() if matches(r)]
            if f.id_prefix is not None:
                found = sorted((r for r in found if not isinstance(after, str) or r.id > after), key=lambda r: r.id)
            else:
                found = sorted((r for r in found if not isinstance(after, tuple) or (r.deadline_us, r.seq) > after),
                               key=lambda r: (r.deadline_us, r.seq))
            return [Listed(_state(r), r.id, cron.from_us(r.deadline_us), r.seq, r.topic or output_topic, r.key,
                           r.ordering_key, r.readied_by, r.cron) for r in found[:limit]]
        return self._run(run)

    def list_parked(self, *, limit: int, before: int | None = None) -> list[ParkedMessage]:
        """Up to `limit` parked messages numbered below `before`, newest first."""
        def shown(p: StoredParked) -> ParkedMessage:
            m = p.message
            return ParkedMessage(p.number, m.message_id, m.source, m.topic, m.deadline, m.key,
                                 codec.decode_headers(m.headers) if m.headers else [],
                                 None if m.value is None else len(m.value),
                                 b"" if m.value is None else m.value[:PREVIEW_BYTES], m.reason, cron.from_us(p.parked_us))
        return self._run(lambda now: [shown(p) for p in reversed(self.db.parked)
                                      if before is None or p.number < before][:limit])

    def list_schedules(self) -> list[Schedule]:
        """Every recurring schedule, by next occurrence (then id)."""
        def run(now: int) -> list[Schedule]:
            found = [Schedule(r.id, r.cron, r.timezone or "UTC", r.deadline_us, r.topic, r.ordering_key,
                              cron.from_us(r.enqueued_us)) for r in self.db.rows.values() if r.cron is not None]
            return sorted(found, key=lambda s: (s.next_us, s.id))
        return self._run(run)

    def present(self, ids: Sequence[str]) -> dict[str, bool]:
        """Of these ids, those held, each with whether a firer holds it."""
        return self._run(lambda now: {i: self.db.rows[i].readied_us is not None for i in ids if i in self.db.rows})

    def apply_action(self, action: str, ids: Sequence[str], at: datetime | None, *, counted: bool) -> list[str]:
        """Cancel, fire now or reschedule the rows no firer holds, and count it, all at once."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")

        def run(now: int) -> list[str]:
            db = self.db
            changed = []
            for mid in dict.fromkeys(ids):
                row = db.rows.get(mid)
                if row is None or row.readied_us is not None:
                    continue
                if action == "cancel":
                    del db.rows[mid]
                else:
                    assert at is not None  # inspect.act sets it for fire-now and reschedule
                    to = cron.to_us(at)
                    row.deadline_us, row.ctid = min(row.deadline_us, to) if action == "fire_now" else to, db.new_ctid()
                changed.append(mid)
            times, messages = db.actions.get(action, (0, 0))
            db.actions[action] = (times + (1 if counted else 0), messages + len(changed))
            return changed
        return self._run(run)

    def action_totals(self) -> dict[str, tuple[int, int]]:
        """action -> (times taken, messages changed)."""
        return self._run(lambda now: dict(sorted(self.db.actions.items())))

    def announced(self, within_ms: int) -> list[Announced]:
        """The processes that said where they serve /metrics within the last `within_ms`."""
        return self._run(lambda now: sorted(
            (Announced(role, str(node), url, (now - at) / 1e6) for node, (role, url, at) in self.db.processes.items()
             if now - at < within_ms * 1000), key=lambda a: (a.role, a.url)))


def _state(row: StoredRow) -> str:
    return state_of(row.cron, row.readied_us is not None)

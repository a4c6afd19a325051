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
from chronos.domain.operators import (ACTIONS, HELD_WITHIN_MS, PREVIEW_BYTES, Filters, Listed, Message, ParkedFilters,
                                      ParkedMessage, ParkedRecord, ParkedRef, Position, Schedule, state_of)
from chronos.domain.reasons import code_of


class MemoryOperators(MemoryHandle):
    """The operators' side of the twin."""

    def show(self, message_id: str, *, output_topic: str) -> Message | None:
        """The message or schedule with this id (its value's first PREVIEW_BYTES), or None."""
        def run(now: int) -> Message | None:
            r = self.db.rows.get(message_id)
            if r is None:
                return None
            holder = r.holder
            return Message(id=r.id, state=_state(r), deadline=cron.from_us(r.deadline_us), topic=r.topic or output_topic,
                           key=r.key, headers=codec.decode_headers(r.headers) if r.headers else [],
                           value_size=None if r.value is None else len(r.value),
                           value_preview=b"" if r.value is None else r.value[:PREVIEW_BYTES],
                           ordering_key=r.ordering_key, enqueued_at=cron.from_us(r.enqueued_us),
                           firer=None if holder is None else holder[0],
                           claimed_at=None if holder is None else cron.from_us(holder[1]), cron=r.cron,
                           timezone=(r.timezone or "UTC") if r.cron is not None else None, dst_policy=r.dst_policy,
                           attempts=r.attempts, last_error=r.last_error,
                           original_deadline=None if r.original_deadline_us is None
                           else cron.from_us(r.original_deadline_us))
        return self._run(run)

    def list_messages(self, f: Filters, *, output_topic: str, limit: int, after: Position | None = None,
                      not_at: datetime | None = None, held_within_ms: int = HELD_WITHIN_MS) -> list[Listed]:
        """Up to `limit` rows matching `f` after `after`: in (deadline, seq) order, in id order with an id
        prefix (a string's code points: the order of PostgreSQL's C collation, the embedded server's). Every
        held row is found, however far ahead (`held_within_ms` bounds only PostgreSQL's search)."""
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
                           r.ordering_key, r.readied_by if r.held_by is None else r.held_by.node, r.cron)
                    for r in found[:limit]]
        return self._run(run)

    def key_search(self) -> bool:
        return True  # its search by key reads every row whatever happens: there is no index to build

    def list_parked(self, *, limit: int, before: int | None = None,
                    filters: ParkedFilters | None = None) -> list[ParkedMessage]:
        """Up to `limit` parked messages numbered below `before` and matching `filters`, newest first."""
        f = filters or ParkedFilters()
        return self._run(lambda now: [_shown(p) for p in reversed(self.db.parked)
                                      if (before is None or p.number < before) and _matches(p, f)][:limit])

    def show_parked(self, number: int) -> ParkedMessage | None:
        """The parked message of this number (its value's first PREVIEW_BYTES), or None."""
        return self._run(lambda now: next((_shown(p) for p in self.db.parked if p.number == number), None))

    def find_parked(self, numbers: Sequence[int]) -> list[ParkedRef]:
        """Those of these numbers that are parked, oldest first."""
        wanted = set(numbers)
        return self._run(lambda now: [_ref(p) for p in self.db.parked if p.number in wanted])

    def walk_parked(self, filters: ParkedFilters, *, limit: int, after: int | None = None) -> list[ParkedRef]:
        """Up to `limit` parked messages matching `filters` numbered above `after`, oldest first."""
        return self._run(lambda now: [_ref(p) for p in self.db.parked
                                      if (after is None or p.number > after) and _matches(p, filters)][:limit])

    def load_parked(self, numbers: Sequence[int]) -> list[ParkedRecord]:
        """Those of these parked messages still parked, whole, oldest first."""
        wanted = set(numbers)
        return self._run(lambda now: [ParkedRecord(p.number, p.message.message_id, p.message.topic, p.message.key,
                                                   p.message.value, p.message.headers)
                                      for p in self.db.parked if p.number in wanted])

    def settle_replayed(self, replayed: Sequence[int], refused: Sequence[tuple[int, str]], *, counted: bool) -> int:
        """Delete the replayed, give the refused their new reason, and count the replay, all at once."""
        def run(now: int) -> int:
            deleted = self._delete_parked(replayed)
            reasons = dict(refused)
            for p in self.db.parked:
                if p.number in reasons:
                    p.message.reason = reasons[p.number]
            self._count("replay_parked", counted, len(deleted))
            return len(deleted)
        return self._run(run)

    def drop_parked(self, numbers: Sequence[int], *, counted: bool) -> list[int]:
        """Delete these parked messages and count the drop, all at once."""
        def run(now: int) -> list[int]:
            dropped = self._delete_parked(numbers)
            self._count("drop_parked", counted, len(dropped))
            return dropped
        return self._run(run)

    def _delete_parked(self, numbers: Sequence[int]) -> list[int]:
        wanted = set(numbers)
        gone = [p.number for p in self.db.parked if p.number in wanted]
        self.db.parked = [p for p in self.db.parked if p.number not in wanted]
        return gone

    def _count(self, action: str, counted: bool, messages: int) -> None:
        times, total = self.db.actions.get(action, (0, 0))
        self.db.actions[action] = (times + (1 if counted else 0), total + messages)

    def list_schedules(self) -> list[Schedule]:
        """Every recurring schedule, by next occurrence (then id)."""
        def run(now: int) -> list[Schedule]:
            found = [Schedule(r.id, r.cron, r.timezone or "UTC", r.deadline_us, r.topic, r.ordering_key,
                              cron.from_us(r.enqueued_us)) for r in self.db.rows.values() if r.cron is not None]
            return sorted(found, key=lambda s: (s.next_us, s.id))
        return self._run(run)

    def present(self, ids: Sequence[str]) -> dict[str, bool]:
        """Of these ids, those held, each with whether a firer holds it."""
        return self._run(lambda now: {i: self.db.rows[i].in_flight for i in ids if i in self.db.rows})

    def apply_action(self, action: str, ids: Sequence[str], at: datetime | None, *, counted: bool) -> list[str]:
        """Cancel, fire now or reschedule the rows no firer holds, and count it, all at once."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")

        def run(now: int) -> list[str]:
            db = self.db
            changed = []
            for mid in dict.fromkeys(ids):
                row = db.rows.get(mid)
                if row is None or row.in_flight:
                    continue
                if action == "cancel":
                    del db.rows[mid]
                else:
                    assert at is not None  # inspect.act sets it for fire-now and reschedule
                    to = cron.to_us(at)
                    row.deadline_us, row.ctid = min(row.deadline_us, to) if action == "fire_now" else to, db.new_ctid()
                changed.append(mid)
            self._count(action, counted, len(changed))
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
    return state_of(row.cron, row.in_flight)


def _shown(p: StoredParked) -> ParkedMessage:
    m = p.message
    return ParkedMessage(p.number, m.message_id, m.source, m.topic, m.deadline, m.key,
                         codec.decode_headers(m.headers) if m.headers else [],
                         None if m.value is None else len(m.value),
                         b"" if m.value is None else m.value[:PREVIEW_BYTES], m.reason, cron.from_us(p.parked_us))


def _ref(p: StoredParked) -> ParkedRef:
    m = p.message
    return ParkedRef(p.number, m.topic, sum(len(b) for b in (m.key, m.value, m.headers) if b is not None))


def _matches(p: StoredParked, f: ParkedFilters) -> bool:
    """As parked_filters in queries.sql."""
    m = p.message
    after, before = (None if t is None else cron.to_us(t) for t in (f.parked_after, f.parked_before))
    return ((f.topic is None or m.topic == f.topic) and (f.reason is None or code_of(m.reason) == f.reason)
            and (after is None or p.parked_us > after) and (before is None or p.parked_us < before)
            and (f.id_prefix is None or (m.message_id is not None and m.message_id.startswith(f.id_prefix))))

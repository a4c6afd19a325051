"""The rows the sender holds, in publishing order (`Held`), and which of them it may no longer
publish: those claimed too long ago."""

from __future__ import annotations

import bisect

from chronos.domain.model import Claimed

# (local deadline, seq, arrival, claimed at (monotonic: when its claim was sent), row): never compares rows
HeldEntry = tuple[float, int, int, float, Claimed]
_AFTER_ANY = float("inf")  # (horizon, inf) sorts after every entry of that deadline: seq is an int

# A row held longer than this share of the hold time since its claim may be a peer's already (a
# detector hands back rows held past the hold time): it is handed back, never published. The
# quarter left is for the publish to land and for the clocks of the detector's database and this
# machine to differ.
PUBLISHABLE_SHARE = 0.75


class Held:
    """The rows the sender holds, in publishing order: the local deadline (the deadline as
    scheduled, on this machine's clock), then the row's enqueue order, then arrival.

    A sorted list read from `head` on. A claim takes rows in deadline order, so its rows nearly always
    go after every row held: they are appended as they come, and each publish takes a run from the
    front, one comparison per row either way. A claim with rows earlier than some held ones (a retry,
    a message due within the lookahead that came after the previous claim) is merged in from its
    place on. A heap's pop compared entries about log2(n) times per row instead; what that cost the
    sender is measured in docs/benchmarks/hot-path.md ("The firer under load").

    `take_due` also sets apart the rows claimed longer than `hold_limit` ago (`PUBLISHABLE_SHARE` of
    the hold time), which the sender must not publish: it was stopped or starved (a frozen VM, a
    SIGSTOP, a claim that took as long) and a peer may hold them, or have fired them, by now.
    `oldest_claim`, a bound no later than the claim of any row held, spares the look at each row's
    claim while none can be that old."""

    COMPACT_AT = 4096  # drop the taken entries once this many and half the list are taken

    def __init__(self, hold_time_ms: float = _AFTER_ANY) -> None:
        self.hold_limit = hold_time_ms * PUBLISHABLE_SHARE / 1000.0  # seconds
        self.entries: list[HeldEntry] = []
        self.head = 0
        self.oldest_claim = _AFTER_ANY

    def __len__(self) -> int:
        return len(self.entries) - self.head

    def first(self) -> float | None:
        """The earliest local deadline held, None when nothing is."""
        return self.entries[self.head][0] if self.head < len(self.entries) else None

    def add(self, new: list[HeldEntry], claimed_at: float) -> None:
        """Hold the rows of one claim, sent at `claimed_at` (each entry carries it too)."""
        if not new:
            return
        new.sort()  # a claim's rows come sorted: one comparison each
        entries = self.entries
        if self.head == len(entries):
            entries.clear()
            self.head = 0
            self.oldest_claim = _AFTER_ANY
        self.oldest_claim = min(self.oldest_claim, claimed_at)
        if not entries or entries[-1] < new[0]:
            entries.extend(new)
            return
        at = bisect.bisect_left(entries, new[0], lo=self.head)
        tail = entries[at:]
        del entries[at:]
        entries.extend(sorted(tail + new))  # two sorted runs: merged by the sort in linear time

    def take_due(self, horizon: float, now: float) -> tuple[list[Claimed], list[Claimed]]:
        """The rows whose local deadline is at or before `horizon`, in order, taken out: (those to
        publish, those claimed more than `hold_limit` before `now`, monotonic, which must not be)."""
        entries, head = self.entries, self.head
        end = bisect.bisect_right(entries, (horizon, _AFTER_ANY), lo=head)
        if end == head:
            return [], []
        expired: list[Claimed] = []
        expired_before = now - self.hold_limit
        if self.oldest_claim >= expired_before:
            due = [entry[4] for entry in entries[head:end]]
        else:
            due = []
            for entry in entries[head:end]:
                (expired if entry[3] < expired_before else due).append(entry[4])
            self.oldest_claim = min((entry[3] for entry in entries[end:]), default=_AFTER_ANY)
        if end >= self.COMPACT_AT and 2 * end >= len(entries):
            del entries[:end]
            end = 0
        self.head = end
        return due, expired

    def take_all(self) -> list[Claimed]:
        rows = [entry[4] for entry in self.entries[self.head:]]
        self.entries, self.head, self.oldest_claim = [], 0, _AFTER_ANY
        return rows

"""Firers that divide the due rows instead of racing for them.

Two firers whose claims scan the same due rows skip each other's locked candidates: with two, 26-80 %
of the rows a claim took had first been fetched, and skipped, by the other's concurrent claim. So the
rows are cut into `SLICES` slices (by a hash of the ordering key, else of the id: a key's rows share a
slice) and the live firers divide the slices among them: each claims first from its own. A firer is
live while its lease (a row of chronos_firers, renewed every `renew_every`) is younger than the hold
time, so one that dies or hangs loses its slices to the others within the hold time, as its claimed
rows pass to them; one that stops gives them up at once.

The division is advisory: every claim still locks its rows (`FOR UPDATE SKIP LOCKED`), so two firers
that briefly disagree on it (one has seen a new peer, the other not yet) only race as before, and no
row is ever claimed twice. A firer whose own slices are drained takes another's rows only when that
one has gone quiet (its lease not renewed for `QUIET_RENEWALS` renewals: hung, frozen, cut off, or
waiting for Kafka), once they are overdue by `overdue_ms`; and any slice's rows once overdue by the
hold time (an owner that renews its lease and still serves nothing). It does not take the rows of an
owner that is only late: the two would claim the same rows from the same end, and every row one takes
the other fetches and skips.

Pure decisions here; the leases and the claims are the stores' (`firer_heartbeat`, `claim_share`).
"""

from __future__ import annotations

import uuid
from typing import Iterable, Mapping

SLICES = 16  # as in the due index's last column (migration 0020): hashtext(coalesce(ordering_key, id)) & 15
LEASES_AGAIN_S = 30.0  # seconds: how often a firer on a schema without leases looks for them again
RENEW_EVERY = 0.5  # seconds between a firer's lease renewals, at most (a quarter of the hold time if shorter)
QUIET_RENEWALS = 3  # a firer whose lease was not renewed for this many renewals has gone quiet


def slices_of(me: uuid.UUID, others: Iterable[uuid.UUID]) -> tuple[int, ...] | None:
    """The slices that are `me`'s among the live firers (`others`: the live ones besides me): the
    i-th of n firers, in node id order, owns the i-th of n runs of consecutive slices, as even as whole
    slices go (the claim of a firer's slices is one range of the due index, `slice_span`). None when it
    is alone: every slice is its own, and it claims as a firer with no shares does. Every firer that sees
    the same live firers works out the same division."""
    nodes = sorted({me, *others})
    if len(nodes) == 1:
        return None
    return consecutive(tuple(range(SLICES)), nodes.index(me), len(nodes))


def consecutive(slices: tuple[int, ...], part: int, parts: int) -> tuple[int, ...]:
    """The `part`-th of `parts` runs of `slices`, one after another, as even as whole slices go, the longer
    runs first (none for the last parts when there are fewer slices than parts)."""
    return slices[-(-part * len(slices) // parts):-(-(part + 1) * len(slices) // parts)]


def quiet_slices(me: uuid.UUID, others: Mapping[uuid.UUID, int], quiet_ms: float) -> tuple[int, ...]:
    """The slices of the other live firers (`others`: node -> milliseconds since its lease was renewed)
    that have gone quiet (not renewed for `quiet_ms`), in the division every firer works out alike."""
    live = {me, *others}
    return tuple(sorted(s for node, age in others.items() if node != me and age >= quiet_ms
                        for s in slices_of(node, live - {node}) or ()))


def claimer_slices(firer_slices: tuple[int, ...] | None, part: int, parts: int) -> tuple[int, ...]:
    """The slices the `part`-th of a firer's `parts` claimers claims, of the firer's (`firer_slices`,
    None: every slice): the `part`-th run of them, so no two claimers share a slice, nor a key (a key's
    rows share one). None of them when the firer has fewer slices than claimers."""
    return consecutive(tuple(range(SLICES)) if firer_slices is None else firer_slices, part, parts)


def slice_span(slices: tuple[int, ...]) -> tuple[int, int, int]:
    """The claim of `slices` in the due index's terms (`claim_share`): the lowest and the highest of them,
    the range the index reads, and the bit mask of them, which leaves out the slices within that range
    that are not among them."""
    return min(slices), max(slices), sum(1 << s for s in set(slices))


def overdue_ms(poll_interval_ms: int) -> int:
    """How long past its deadline a row of another firer's slice waits before this firer takes it.
    Its owner claims its rows up to the lookahead ahead, once per poll interval (give or take a
    tenth): a row still unclaimed two poll intervals after its deadline means its owner is behind,
    hung or gone (or the row was written or handed back that late)."""
    return 2 * poll_interval_ms


def strays_every(hold_time_ms: int) -> float:
    """Seconds between two claims of any slice's rows overdue by the hold time (the claimer's last look, for
    an owner that renews its lease yet serves nothing): such a row waits at most a quarter of the hold time
    longer."""
    return hold_time_ms / 4000.0


class Shares:
    """One firer's view of the division: its slices (None: all of them, it is alone) and when its lease
    is renewed next. Times are monotonic seconds, given by the caller."""

    def __init__(self, me: uuid.UUID, hold_time_ms: int):
        self.me = me
        self.renew_every = min(RENEW_EVERY, hold_time_ms / 4000.0)
        self.mine: tuple[int, ...] | None = None
        self.quiet: tuple[int, ...] = ()  # the slices of the others that have gone quiet
        self.firers = 1  # live firers, this one included, at the last renewal
        self.next_renewal = 0.0
        self.leases = True  # False: the schema has no firers' leases (before version 9), every slice is this one's

    def without_leases(self, now: float) -> None:
        """The schema has no leases (a store not yet migrated to version 9): this firer claims from every
        slice, as a firer alone, and asks again after `LEASES_AGAIN_S` (`now` monotonic)."""
        self.leases = False
        self.mine = None
        self.quiet = ()
        self.firers = 1
        self.next_renewal = now + LEASES_AGAIN_S

    def renewal_due(self, now: float) -> bool:
        return now >= self.next_renewal

    def renewed(self, others: Mapping[uuid.UUID, int], now: float) -> bool:
        """The lease was renewed at `now` and these other firers are live (node -> milliseconds since it
        renewed its lease): this firer's slices from now on, and the quiet ones' (`quiet_slices`).
        Whether the number of live firers changed."""
        others = {node: age for node, age in others.items() if node != self.me}
        self.leases = True
        self.mine = slices_of(self.me, others)
        self.quiet = quiet_slices(self.me, others, QUIET_RENEWALS * self.renew_every * 1000.0)
        self.next_renewal = now + self.renew_every
        changed = len(others) + 1 != self.firers
        self.firers = len(others) + 1
        return changed

    def takes_others(self, full_pass: bool, own_backlog: bool, claimers: int = 1) -> bool:
        """Whether this claim also takes the others' overdue rows (`taken_slices`, and any slice's
        overdue by the hold time): only in a pass that may look at rows due long ago (a full claim, see
        the claimer), only once its own slices are drained (its own claim came back with no slice
        full), and only when there are others: other firers, or other `claimers` of this one."""
        return (self.mine is not None or claimers > 1) and full_pass and not own_backlog

    def taken_slices(self, claimers: int = 1) -> tuple[int, ...]:
        """The slices whose rows overdue by `overdue_ms` this firer's first claimer takes: the quiet
        firers', and those of this firer's other `claimers` (threads of this process: whether they are
        behind is not known from a lease)."""
        if claimers == 1:
            return self.quiet
        own = claimer_slices(self.mine, 0, claimers)
        siblings = tuple(s for s in (range(SLICES) if self.mine is None else self.mine) if s not in own)
        return tuple(sorted(set(self.quiet) | set(siblings)))

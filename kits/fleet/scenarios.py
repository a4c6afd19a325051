"""Partitions under load on a fleet (kits.fleet): the scenarios, what they measure, and their verdict.

Each scenario runs a steady load from the client host (kits.traffic's `Load` and `Reader`, in the
client's network), cuts a host off as the scenario says, heals it, drains, and returns one row of
figures: messages sent (acknowledged by the broker), lost, early and duplicated (and how many
duplicates the fault explains, how many the cut-off host published after the heal), the longest pause
in deliveries and when it ended (after the fault, the heal or the promotion), the latest delivery,
and what operators saw meanwhile: each program's /healthz as the monitoring host (the client) and as
the host itself saw it, the first log lines that named the fault, `chronos status` from a host on the
right side. The scenarios (docs/operations/failure-behaviour.md shows the figures):

    primary      a) the PostgreSQL primary's host cut off from everything: Patroni promotes the
                    synchronous standby, the old primary demotes itself and rejoins after the heal
    host         b) a Chronos host cut off from everything
    host-db      c) a Chronos host cut off from PostgreSQL only (Kafka reachable)
    host-kafka   d) a Chronos host cut off from Kafka only (PostgreSQL reachable)
    kafka        e) the Kafka host cut off from everything
    primary-out  f) one-way loss: what the primary's host sends is dropped, what it receives arrives

and, not a partition, `rolling_upgrade`: g) a rolling upgrade from the previous release and a rollback, with
the upgrade page's blocks (docs/operations/upgrading.md).

On a fleet of two cells (`Fleet(..., cells=2)`), the scenarios of one cell: `primary_cut(cell=...)` cuts off that
cell's primary, `primary_kill` kills it outright, `host_cut(peers=<cell>)` cuts a Chronos host off from that cell
only, `partition_move` moves an input partition to another cell with `chronos cells move` run on a host; each row
also gives the latest delivery of each cell's messages due during the fault
(`max_lateness_during_fault_by_cell_s`), and the latest publish by their CreateTime
(`max_publish_lateness_during_fault_by_cell_s`), the other cells' being the ones that must stay on time.
"""

from __future__ import annotations

import re
import shlex
import threading
import time
from typing import Any, Callable

import orjson
import psycopg

from chronos.adapters.postgres.store import Store
from chronos.domain.cells import OPEN
from chronos.domain.model import Row
from chronos.domain.moves import MOVE_NODE
from chronos.roles.firer.held import PUBLISHABLE_SHARE
from kits.figures import percentiles
from kits.fleet import ROOT, ChronosHost, Fleet, FleetError, page_blocks, wait
from kits.stack import http_get
from kits.traffic import Load, Reader
from kits.verdicts import LATE_S, Fault, Report, analyse, longest_pause

# a publish whose acknowledgement a cut can lose was produced this many seconds before it at most
# (a batch lingers 100 ms at most, and the broker answers within milliseconds on the bridge)
ACK_WINDOW_S = 2.0
SCENARIOS = ("primary", "host", "host-db", "host-kafka", "kafka", "primary-out")
LOG_SIGNS = ("postgres unavailable", "did not answer within", "another server than before", "is read-only",
             "kafka unavailable", "left consumer group", "rejoining consumer group",
             "held rows were claimed more than", "claiming nothing until Kafka", "publishing stalled",
             "publishing works again",
             "reachable again", "suspected")


# Run on a host by the host's own Python: each program's /healthz as "<program> <status> <body>" lines.
OWN_HEALTH = """
import sys, urllib.request, urllib.error
for arg in sys.argv[1:]:
    program, port = arg.split("=")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=0.8) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    except OSError:
        status, body = 0, b""
    print(program, status, body.decode(errors="replace").replace(chr(10), " "))
"""


class Watch(threading.Thread):
    """Every second, from the client host: each program's /healthz on every Chronos host (as a monitoring
    host scrapes it) and the Patroni leader; from the cut-off host itself, its programs' /healthz (what
    the host believes: a cut-off host cannot be scraped)."""

    def __init__(self, fleet: Fleet, inside: str | None = None, every: float = 1.0):
        super().__init__(daemon=True, name="fleet-watch")
        self.fleet, self.inside, self.every = fleet, inside, every
        self.samples: list[dict[str, Any]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.every):
            at = time.time()
            sample: dict[str, Any] = {"at": at, "scraped": {}, "own": {}}
            for host in self.fleet.chronos:
                for program in host.programs():
                    status, report = self.fleet.hosts.health(host, program, timeout=0.8)
                    sample["scraped"][f"{host.name}/{program}"] = _health_word(status, report)
            if self.inside is not None:
                sample["own"] = self._own_view(self.fleet.hosts.host(self.inside))
            self.samples.append(sample)

    def _own_view(self, host: ChronosHost) -> dict[str, str]:
        """The host's programs' /healthz asked on the host itself (its loopback stays reachable): one
        short Python of the host's own, not a CLI start per program, to keep the sampling light."""
        args = " ".join(f"{p}={host.metrics_port(p)}" for p in host.programs())
        try:
            done = self.fleet.hosts.on(host, f"/opt/chronos/venv/bin/python -I -c {shlex.quote(OWN_HEALTH)} {args}",
                                 timeout=10, check=False)
        except Exception:  # noqa: BLE001 - a sample missed is a gap in the timeline, not a failure
            return {}
        out = {}
        for line in done.stdout.splitlines():
            program, _, body = line.partition(" ")
            status, _, body = body.partition(" ")
            try:
                report = orjson.loads(body) if body.strip() else {}
            except ValueError:
                report = {}
            out[program] = _health_word(int(status), report if isinstance(report, dict) else {})
        return out

    def stop(self) -> None:
        self.halt.set()
        self.join(15)

    def timeline(self, since: float) -> dict[str, list[tuple[float, str]]]:
        """Per program (scraped or `own:`), its health changes after `since`: (seconds after, word)."""
        changes: dict[str, list[tuple[float, str]]] = {}
        last: dict[str, str] = {}
        for s in self.samples:
            for kind, prefix in (("scraped", ""), ("own", f"own:{self.inside}/")):
                for program, word in s[kind].items():
                    key = prefix + program
                    if last.get(key) != word:
                        last[key] = word
                        if s["at"] >= since - 1.0:
                            changes.setdefault(key, []).append((round(s["at"] - since, 1), word))
        return changes


def _health_word(status: int, report: dict[str, Any]) -> str:
    """`ok`, `unreachable`, or `failing: <checks that fail>`."""
    if status == 0:
        return "unreachable"
    if status == 200:
        return "ok"
    failing = sorted(name for name, check in (report.get("checks") or {}).items() if not check.get("ok"))
    return "failing: " + ",".join(failing or [str(report.get("reason") or status)])


def first_log_lines(fleet: Fleet, since: float) -> dict[str, tuple[float, str]]:
    """The first line of each of LOG_SIGNS after `since`, over every program of every host: sign ->
    (seconds after, `host/program`)."""
    found: dict[str, tuple[float, str]] = {}
    for host in fleet.chronos:
        for program in host.programs():
            for line in host.log(program).splitlines():
                sign = next((s for s in LOG_SIGNS if s in line), None)
                if sign is None:
                    continue
                at = _log_time(line)
                if at is not None and at >= since and (sign not in found or at - since < found[sign][0]):
                    found[sign] = (round(at - since, 1), f"{host.name}/{program}")
    return dict(sorted(found.items(), key=lambda kv: kv[1][0]))


def _log_time(line: str) -> float | None:
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?", line)
    if match is None:
        return None
    return time.mktime(time.strptime(match[1], "%Y-%m-%dT%H:%M:%S")) - time.timezone + float(match[2] or 0)


class FleetScenario:
    """One scenario's load, reader and faults on a running fleet; `finish` drains and judges."""

    def __init__(self, fleet: Fleet, name: str, *, rate: float = 300, watch_inside: str | None = None,
                 seed: int | None = None):
        self.fleet, self.name, self.rate = fleet, name, rate
        self.hold_s = int(fleet.hosts.environment(fleet.chronos[0]).get("CHRONOS_HOLD_TIME_MS", "5000")) / 1000.0
        self.faults: list[Fault] = []
        self.watch = Watch(fleet, watch_inside)
        self.seed = seed
        self.load: Load | None = None
        self.reader: Reader | None = None
        self.started = time.time()
        self.restarts_before = self._starts()

    def __enter__(self) -> "FleetScenario":
        with self.fleet.net.inside("client"):  # the clients' threads and sockets are the client host's
            self.reader = Reader(self.fleet.kafka.bootstrap, self.fleet.kafka.topics["output"], fetch_wait_ms=10)
            self.reader.start()
            self.reader.wait_assigned()
            self.load = Load(self.fleet.kafka.bootstrap, self.fleet.kafka.topics["input"], rate=self.rate, seed=self.seed)
            self.load.start()
        self.watch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.watch.stop()
        if self.load is not None and self.load.is_alive():
            self.load._halt.set()
            self.load.join(10)
        if self.reader is not None and self.reader.is_alive():
            self.reader.stop()

    def fault(self, what: str, start: float, end: float | None = None) -> Fault:
        f = Fault(what, start, end)
        self.faults.append(f)
        return f

    def _starts(self) -> dict[str, int]:
        return {f"{h.name}/{p}": h.log(p).count("starting: node") for h in self.fleet.chronos for p in h.programs()}

    def restarted(self) -> dict[str, int]:
        """Programs started again during the scenario (by supervisord, after a crash): name -> times."""
        now = self._starts()
        return {k: v - self.restarts_before.get(k, 0) for k, v in now.items() if v > self.restarts_before.get(k, 0)}

    def finish(self, drain: float = 45.0, settle: float = 3.0) -> Report:
        assert self.load is not None and self.reader is not None
        self.load.stop(flush_timeout=90)
        wait = max(0.0, self.load.last_due - time.time()) + self.hold_s + drain
        self.reader.wait_for(self.load.sent, timeout=wait)
        time.sleep(settle)  # late duplicates
        self.reader.stop()
        self.dump()
        observed = self.rebalances()
        report = analyse(self.name, self.load, self.reader, self.faults + observed, hold_s=self.hold_s,
                         window_explains=True)
        report.session_losses = len(observed)
        if report.lost:
            with self.fleet.net.inside("client"):
                found = self.reader.reread(set(report.lost))
            report.lost_found_on_reread = sorted(found)
            report.lost = [m for m in report.lost if m not in found]
            report.delivered += len(found)
        return report

    def rebalances(self, before: float = 10.0) -> list[Fault]:
        """The consumer group's rebalances the consumers' logs show during the scenario, as observed faults:
        a consumer that leaves or rejoins the group, or whose session or commit was lost, leaves its
        uncommitted batch to be read again, so what was sent in the seconds `before` may be published
        twice (its late messages, published straight away, above all)."""
        signs = ("left consumer group", "rejoining consumer group", "offset commit failed", "session timed out")
        found = []
        for host in self.fleet.chronos:
            for program in host.programs():
                if not program.startswith("consumer"):
                    continue
                for line in host.log(program).splitlines():
                    if any(sign in line for sign in signs):
                        at = _log_time(line)
                        if at is not None and at >= self.started:
                            found.append(Fault(f"{host.name}/{program}: {line[24:104].strip()}", at - before, at + 2.0,
                                               observed=True))
        return found

    def dump(self) -> None:
        """Everything sent and read, and the faults, beside the fleet's logs, for a look after the run."""
        assert self.load is not None and self.reader is not None
        slug = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        (self.fleet.workdir / f"raw-{slug}-{int(self.started)}.json").write_bytes(orjson.dumps({
            "sent": {m: [s.deadline, s.produced, s.partition, s.offset] for m, s in self.load.sent.items()},
            "arrivals": self.reader.arrivals, "create_times": self.reader.create_times,
            "faults": [{"what": f.what, "start": f.start, "end": f.end} for f in self.faults]}))

    def landed_after(self, heal_at: float, fault_at: float) -> tuple[list[str], list[str], list[str], list[str]]:
        """Messages delivered before the heal and again after it, in four lists: those whose later copy
        was produced while the cut-off host still held them (before the cut, or within three quarters of
        the hold time after it, past which a firer publishes none of the rows it claimed before: its
        request reached the broker only after the heal, sent again by the host's kernel); those whose
        first copy was produced in the last seconds before the cut and none landed during it (the broker
        stored it, its acknowledgement was lost in the cut, so the firer handed the row back when it
        replaced its producer and it fired again after the heal: at least once, by the row's holder);
        those sent during the cut, which no host cut off then can have held (read again by the consumer
        group when the cut-off host rejoined it after the heal, at least once: the report's rebalances
        explain them); and those produced later otherwise (a host that published rows it no longer held:
        must be none)."""
        assert self.load is not None and self.reader is not None
        in_flight: list[str] = []
        unacknowledged: list[str] = []
        sent_during: list[str] = []
        republished: list[str] = []
        held_until = fault_at + PUBLISHABLE_SHARE * self.hold_s + 0.1  # CreateTime has millisecond precision
        for m, sent in self.load.sent.items():
            arrivals = self.reader.arrivals.get(m, ())
            if len(arrivals) < 2 or not min(arrivals) < heal_at <= max(arrivals):
                continue
            created = self.reader.create_times[m]
            later = [c for a, c in zip(arrivals, created) if a >= heal_at]
            if all(c < held_until for c in later):
                in_flight.append(m)
            elif fault_at - ACK_WINDOW_S <= created[0] <= fault_at + 0.1 and \
                    not any(fault_at + 1.0 < a < heal_at for a in arrivals):
                unacknowledged.append(m)
            elif sent.produced > fault_at + 0.1:
                sent_during.append(m)
            else:
                republished.append(m)
        return sorted(in_flight), sorted(unacknowledged), sorted(sent_during), sorted(republished)

    def deliveries(self, ids: list[str], zero: float, limit: int = 5) -> dict[str, dict[str, Any]]:
        """The first `limit` of `ids`, each with when it was sent, produced by a firer (CreateTime) and read,
        in seconds after `zero`: what a verdict shows of the messages it blames."""
        assert self.load is not None and self.reader is not None
        return {m: {"sent": round(self.load.sent[m].produced - zero, 2),
                    "created": [round(c - zero, 2) for c in self.reader.create_times.get(m, [])],
                    "arrived": [round(a - zero, 2) for a in self.reader.arrivals.get(m, [])]}
                for m in ids[:limit]}

    def published_again(self, heal_at: float) -> float | None:
        """Seconds from the heal to the first publish after it of any delivered message, by its CreateTime
        (when a firer produced it): Chronos's own recovery, without the reader's. A reader cut off with the
        broker reconnects on its client's own backoff, so its first delivery after the heal can come many
        seconds after the firers published again. None when nothing was published after the heal."""
        assert self.reader is not None
        after = [c for times in self.reader.create_times.values() for c in times if c >= heal_at]
        return round(min(after) - heal_at, 2) if after else None

    def lateness_of(self, due_from: float, due_to: float) -> float:
        """The latest delivery after its due time of the messages due between the two times (seconds)."""
        assert self.load is not None and self.reader is not None
        late = [min(self.reader.arrivals[m]) - s.due for m, s in self.load.sent.items()
                if m in self.reader.arrivals and due_from <= s.due <= due_to]
        return max(late, default=0.0)

    def lateness_by_cell(self, due_from: float, due_to: float, *, published: bool = False) -> dict[str, float]:
        """With cells: `lateness_of` each cell's messages (by the cell of their input partition) (seconds); with
        `published`, by their first publish's CreateTime instead of their arrival: what Chronos did, without the
        broker's and the reader's delays (the reader is a thread of the test's own process)."""
        assert self.load is not None and self.reader is not None
        late: dict[str, float] = {}
        times = self.reader.create_times if published else self.reader.arrivals
        for m, s in self.load.sent.items():
            if m in times and due_from <= s.due <= due_to:
                cell = self.fleet.cell_of(s.partition)
                late[cell] = max(late.get(cell, 0.0), min(times[m]) - s.due)
        return {cell: round(value, 2) for cell, value in sorted(late.items())}

    def delivered_within(self, sent_from: float, delivered_by: float) -> dict[str, int]:
        """With cells: how many of each cell's messages sent from `sent_from` on were delivered by `delivered_by`
        (what a cell's partitions let through while a host was cut off from it, say)."""
        assert self.load is not None and self.reader is not None
        counts: dict[str, int] = {cell: 0 for cell in self.fleet.cells}
        for m, s in self.load.sent.items():
            if s.produced >= sent_from and m in self.reader.arrivals and min(self.reader.arrivals[m]) < delivered_by:
                counts[self.fleet.cell_of(s.partition)] += 1
        return counts

    def lateness_p99(self) -> float | None:
        """The 99th percentile of every delivered message's first delivery after its due time (seconds)."""
        if self.load is None or self.reader is None:
            return None
        return (percentiles([min(self.reader.arrivals[m]) - s.due for m, s in self.load.sent.items()
                             if m in self.reader.arrivals]) or {}).get("p99")

    def row(self, report: Report, *, fault_at: float, heal_at: float, promoted_at: float | None = None,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The scenario's figures, as the result file and the pages show them."""
        pause = longest_pause(self, fault_at)  # type: ignore[arg-type]  # duck-typed: .load and .reader
        landed = self.landed_after(heal_at, fault_at)
        row = report.row()
        row.update({
            "fault": self.faults[0].what if self.faults else self.name,
            "cut_s": round(heal_at - fault_at, 1),
            "duplicates_explained": report.duplicates - len(report.unexplained),
            "published_while_held_landed_after_heal": len(landed[0]),
            "unacknowledged_at_cut_fired_after_heal": len(landed[1]),
            "sent_during_cut_fired_again_after_heal": len(landed[2]),
            "republished_after_heal": len(landed[3]),
            "republished_sample": self.deliveries(landed[3], fault_at),
            "longest_pause_s": None if pause is None else round(pause[1] - pause[0], 2),
            "pause_began_after_fault_s": None if pause is None else round(pause[0] - fault_at, 2),
            "pause_ended_after_fault_s": None if pause is None else round(pause[1] - fault_at, 2),
            "pause_ended_after_heal_s": None if pause is None else round(pause[1] - heal_at, 2),
            "published_again_after_heal_s": self.published_again(heal_at),
            "promoted_after_fault_s": None if promoted_at is None else round(promoted_at - fault_at, 2),
            "pause_ended_after_promotion_s": None if pause is None or promoted_at is None
            else round(pause[1] - promoted_at, 2),
            "max_lateness_during_fault_s": round(self.lateness_of(fault_at - self.hold_s, heal_at), 2),
            "max_lateness_during_fault_by_cell_s": self.lateness_by_cell(fault_at - self.hold_s, heal_at)
            if len(self.fleet.cells) > 1 else None,
            "max_publish_lateness_during_fault_by_cell_s":
                self.lateness_by_cell(fault_at - self.hold_s, heal_at, published=True)
            if len(self.fleet.cells) > 1 else None,
            "health": self.watch.timeline(fault_at),
            "alerts": self.fleet.prometheus.alerts(fault_at - 5.0, time.time(), fault_at),
            "scrape_gaps": self.fleet.prometheus.scrape_gaps(fault_at - 5.0, time.time()),
            "first_log_lines": first_log_lines(self.fleet, fault_at),
            "restarted_programs": self.restarted(),
            "lateness_p99_s": self.lateness_p99(),
        })
        row.update(extra or {})
        return row


# -- the scenarios ------------------------------------------------------------------------------------

ScenarioResult = tuple[Report, dict[str, Any]]


def _steady(seconds: float) -> None:
    time.sleep(seconds)


def primary_cut(fleet: Fleet, *, cut_s: float = 60.0, rate: float = 300, warmup: float = 5.0,
                outbound_only: bool = False, cell: str = "cell1") -> ScenarioResult:
    """a) (or f) with `outbound_only`): the primary's host (of `cell`'s cluster, with cells) cut off; the
    standby promoted; the heal; the old primary back as a standby."""
    db = fleet.cells[cell]
    old = db.leader()
    if old is None:
        raise FleetError("no leader to cut off")
    name = "f) primary's packets dropped one way" if outbound_only else "a) primary's host cut off"
    if len(fleet.cells) > 1:
        name += f" (cell {cell})"
    with FleetScenario(fleet, name, rate=rate) as sc:
        _steady(warmup)
        fault_at = fleet.cut(old, inbound=not outbound_only)
        new, promoted_at = db.wait_leader(not_name=old, timeout=max(90.0, cut_s + 30))
        time.sleep(max(0.0, fault_at + cut_s - time.time()))
        status_during = status_from(fleet, fleet.chronos[0])
        heal_at = fleet.heal(old)
        sc.fault(f"{old} cut off {'(outbound only) ' if outbound_only else ''}{cut_s:.0f} s", fault_at, heal_at)
        rejoined = db.wait_streaming(old, timeout=90)
        time.sleep(3)
        report = sc.finish()
        row = sc.row(report, fault_at=fault_at, heal_at=heal_at, promoted_at=promoted_at, extra={
            "old_primary": old, "new_primary": new,
            "old_primary_rejoined_after_heal_s": None if rejoined is None else round(rejoined - heal_at, 1),
            "status_during": status_during})
    return report, row


def host_cut(fleet: Fleet, *, cut_s: float = 60.0, rate: float = 300, warmup: float = 5.0, peers: str = "all",
             host: str = "chronos-1", rejoin_s: float = 8.0) -> ScenarioResult:
    """b), c), d): a Chronos host cut off from everything (`peers` "all"), from PostgreSQL only ("db": every
    member of every cell) or from Kafka only ("kafka"); with cells, from one cell only (`peers` the cell's name:
    every member of its cluster), the row then counting each cell's messages sent during the cut and delivered
    before the heal. The load runs on `rejoin_s` after the heal, while the host takes its work up again."""
    if peers in fleet.cells:
        names: list[str] | None = list(fleet.cells[peers].members)
        label = f"a Chronos host cut off from cell {peers}"
    else:
        names = {"all": None, "db": [m for db in fleet.cells.values() for m in db.members], "kafka": ["kafka-1"]}[peers]
        label = {"all": "b) a Chronos host cut off", "db": "c) a Chronos host cut off from PostgreSQL",
                 "kafka": "d) a Chronos host cut off from Kafka"}[peers]
    other = next(h for h in fleet.chronos if h.name != host)
    with FleetScenario(fleet, label, rate=rate, watch_inside=host) as sc:
        _steady(warmup)
        fault_at = fleet.cut(host, names)
        time.sleep(max(0.0, fault_at + cut_s / 2 - time.time()))
        status_during = status_from(fleet, other)
        time.sleep(max(0.0, fault_at + cut_s - time.time()))
        heal_at = fleet.heal(host)
        sc.fault(f"{host} cut off from {peers} {cut_s:.0f} s", fault_at, heal_at)
        time.sleep(rejoin_s)  # the host rejoins: its consumer takes partitions again, its firer claims again
        report = sc.finish()
        extra: dict[str, Any] = {"status_during": status_during}
        if peers in fleet.cells:
            extra["sent_during_cut_delivered_before_heal_by_cell"] = sc.delivered_within(fault_at, heal_at)
        row = sc.row(report, fault_at=fault_at, heal_at=heal_at, extra=extra)
    return report, row


def assigned(fleet: Fleet, host: ChronosHost, program: str = "consumer_00") -> set[int]:
    """The input partitions a consumer says are its own (its lag gauge, sampled every 5 s), asked from the client
    host; none when it does not answer."""
    with fleet.net.inside("client"):
        status, body = http_get(f"http://{host.address}:{host.metrics_port(program)}/metrics", 2.0)
    found = re.findall(r'^chronos_consumer_lag_messages\{[^}]*partition="(\d+)"', body.decode(errors="replace"), re.M)
    return {int(p) for p in found} if status == 200 else set()


def holder_of(fleet: Fleet, partitions: set[int], timeout: float = 30.0) -> ChronosHost:
    """The Chronos host whose one consumer holds every one of `partitions` (with two consumers and the range
    assignor, one holds the first half of the partitions and the other the second), once it says so."""
    return wait(lambda: next((h for h in fleet.chronos if partitions <= assigned(fleet, h)), None), timeout,
                f"a consumer holding partitions {sorted(partitions)}")


# `chronos cells move` on a host, as the databases' owner: the owner's settings over the host's, as `chronos migrate`
# runs in docs/operations/host-install.md (a move makes triggers on the table)
MOVE = ("(set -a; . /etc/chronos/env; . /etc/chronos/owner.env; set +a; "
        "exec runuser -u chronos -- /opt/chronos/venv/bin/chronos cells move --partition {partition} --to {to})")


def rows_of(fleet: Fleet, partition: int) -> dict[str, int]:
    """Each cell's rows of an input partition not held by a move (none dormant), asked from the client host."""
    counts = {}
    with fleet.net.inside("client"):
        for cell, db in fleet.cells.items():
            with psycopg.connect(db.url(), connect_timeout=5) as conn:
                counts[cell] = conn.execute("SELECT count(*) FROM chronos_messages WHERE input_partition = %s AND "
                                            "readied_by IS DISTINCT FROM %s", (partition, MOVE_NODE)).fetchone()[0]
    return counts


def partition_move(fleet: Fleet, *, partition: int, to: str, rate: float = 300, warmup: float = 5.0,
                   far: int = 2000, settle: float = 5.0, host: str = "chronos-1") -> ScenarioResult:
    """A cell's input partition moved to another cell under load by `chronos cells move`, run on a Chronos host,
    with `far` far-future rows in it: they are all in the new cell afterwards, none left behind."""
    source = next(cell for cell in fleet.cells if partition in cell_partitions(fleet, cell))
    with fleet.net.inside("client"):
        store = Store(fleet.cells[source].url())
        try:
            later = time.time_ns() // 1000 + 30 * 86_400_000_000
            store.apply([Row(f"far-{partition}-{i}", later + i, None, b"k", b"far", b"", None, partition)
                         for i in range(far)], [], [])
        finally:
            store.close()
    with FleetScenario(fleet, f"input partition {partition} moved from cell {source} to cell {to}", rate=rate) as sc:
        _steady(warmup)
        began = time.time()
        done = fleet.hosts.on(host, MOVE.format(partition=partition, to=to), timeout=120.0, check=False)
        ended = time.time()
        sc.fault(f"partition {partition} moved from cell {source} to cell {to} by {host}", began, ended)
        if done.returncode != 0:
            raise FleetError(f"chronos cells move failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        _steady(settle)
        report = sc.finish()
        row = sc.row(report, fault_at=began, heal_at=ended, extra={
            "move_s": round(ended - began, 1), "move_said": done.stdout.splitlines(),
            "rows_after_by_cell": rows_of(fleet, partition)})
    return report, row


def cell_partitions(fleet: Fleet, cell: str) -> list[int]:
    """The input partitions a cell lists now (its map), asked from the client host."""
    with fleet.net.inside("client"):
        store = Store(fleet.cells[cell].url())
        try:
            return [p.partition for p in store.cell_partitions() if p.state == OPEN]
        finally:
            store.close()


def primary_kill(fleet: Fleet, *, cell: str = "cell1", rate: float = 300, warmup: float = 5.0,
                 down_s: float = 30.0) -> ScenarioResult:
    """A cell's primary killed outright (its Patroni and its PostgreSQL, SIGKILL, as a host that loses power):
    the standby promoted once the leader's key expires; the killed member started again after `down_s`, back
    as a standby."""
    db = fleet.cells[cell]
    old = db.leader()
    if old is None:
        raise FleetError("no leader to kill")
    with FleetScenario(fleet, f"a cell's primary killed (cell {cell})", rate=rate) as sc:
        _steady(warmup)
        fault_at = time.time()
        db.kill_member(old)
        new, promoted_at = db.wait_leader(not_name=old, timeout=90.0)
        time.sleep(max(0.0, fault_at + down_s - time.time()))
        status_during = status_from(fleet, fleet.chronos[0])
        back_at = time.time()
        db.start_member(old)
        sc.fault(f"{old} killed, started again after {back_at - fault_at:.0f} s", fault_at, back_at)
        rejoined = db.wait_streaming(old, timeout=90)
        time.sleep(3)
        report = sc.finish()
        row = sc.row(report, fault_at=fault_at, heal_at=back_at, promoted_at=promoted_at, extra={
            "old_primary": old, "new_primary": new,
            "old_primary_rejoined_after_start_s": None if rejoined is None else round(rejoined - back_at, 1),
            "status_during": status_during})
    return report, row


def kafka_cut(fleet: Fleet, *, cut_s: float = 60.0, rate: float = 300, warmup: float = 5.0) -> ScenarioResult:
    """e) the Kafka host cut off from everything."""
    with FleetScenario(fleet, "e) the Kafka host cut off", rate=rate) as sc:
        _steady(warmup)
        fault_at = fleet.cut("kafka-1")
        time.sleep(max(0.0, fault_at + cut_s / 2 - time.time()))
        status_during = status_from(fleet, fleet.chronos[0])
        time.sleep(max(0.0, fault_at + cut_s - time.time()))
        heal_at = fleet.heal("kafka-1")
        sc.fault(f"kafka-1 cut off {cut_s:.0f} s", fault_at, heal_at)
        report = sc.finish(drain=60.0)
        row = sc.row(report, fault_at=fault_at, heal_at=heal_at, extra={"status_during": status_during})
    return report, row


UPGRADING = ROOT / "docs" / "operations" / "upgrading.md"


def _program_pid(fleet: Fleet, host: ChronosHost, program: str) -> int:
    status = fleet.hosts.supervisorctl(host, "pid", f"{program.rsplit('_', 1)[0]}:{program}", check=False).strip()
    if not status.isdigit() or status == "0":
        raise FleetError(f"{host.name}/{program} is not running: {status!r}")
    return int(status)


def rolling_upgrade(fleet: Fleet, *, rate: float = 300, warmup: float = 5.0, settle: float = 8.0) -> ScenarioResult:
    """g) A rolling upgrade under load, with the upgrade page's blocks as written: every host on the previous
    release; the first host upgraded (its link to the new environment, its supervisord restarted), the new
    release on the previous one's schema; an old process of the second host killed (supervisord starts it
    again, on the old release); the second host upgraded; the first rolled back and upgraded again; then the
    schema migrated by the new release, under its running processes. `settle` seconds of load between steps
    (two releases side by side meanwhile)."""
    # each block after the page's releases, as in the shell the reader set them in
    (releases,) = page_blocks(UPGRADING, "upgrade releases")
    migrate, upgrade, rollback = (f"{releases}\n{code}" for tag in ("upgrade migrate", "upgrade host", "rollback host")
                                  for code in page_blocks(UPGRADING, tag))
    first, second = fleet.chronos[0], fleet.chronos[1]
    steps: list[dict[str, Any]] = []

    def step(what: str, action: Callable[[], Any]) -> None:
        began = time.time()
        out = action()
        ended = time.time()
        sc.fault(what, began, ended)
        steps.append({"step": what, "at_s": round(began - t0, 1), "took_s": round(ended - began, 1),
                      "running": {h.name: fleet.hosts.running_releases(h) for h in fleet.chronos},
                      **({"output": out.strip()[-300:]} if isinstance(out, str) and out.strip() else {})})
        time.sleep(settle)

    def kill_old_firer() -> str:
        pid = _program_pid(fleet, second, "firer_00")
        starts = second.log("firer_00").count("starting: node")
        fleet.hosts.on(second, f"kill -KILL {pid}")
        wait(lambda: second.log("firer_00").count("starting: node") > starts, 60, "the killed firer started again")
        return f"firer_00 (pid {pid}) killed; started again on {fleet.hosts.release_of(second)}"

    with FleetScenario(fleet, "g) a rolling upgrade and a rollback", rate=rate) as sc:
        _steady(warmup)
        t0 = time.time()
        before = {h.name: fleet.hosts.running_releases(h) for h in fleet.chronos}
        step(f"{first.name} upgraded", lambda: fleet.hosts.run_block(first, upgrade))
        step(f"{second.name}: an old firer killed", kill_old_firer)
        step(f"{second.name} upgraded", lambda: fleet.hosts.run_block(second, upgrade))
        step(f"{first.name} rolled back", lambda: fleet.hosts.run_block(first, rollback))
        step(f"{first.name} upgraded again", lambda: fleet.hosts.run_block(first, upgrade))
        step("chronos migrate with the new release", lambda: fleet.hosts.run_block(first, migrate))
        done_at = time.time()
        report = sc.finish()
        # the longest gap between deliveries from the first step to the last one's end (and a stall up to it)
        pause = longest_pause(sc, t0, done_at - t0, to_end=True)  # type: ignore[arg-type]  # duck-typed
        row = report.row()
        row.update({
            "fault": "a rolling upgrade and a rollback",
            "steps": steps,
            "running_before": before,
            "duplicates_explained": report.duplicates - len(report.unexplained),
            "longest_pause_s": None if pause is None else round(pause[1] - pause[0], 2),
            "pause_began_s": None if pause is None else round(pause[0] - t0, 2),
            "max_lateness_s": round(sc.lateness_of(t0, done_at), 2),
            "started_again": sc.restarted(),  # by the steps' restarts, and by supervisord after the kill
            "alerts": fleet.prometheus.alerts(t0 - 5.0, time.time(), t0),
            "lateness_p99_s": sc.lateness_p99(),
        })
    return report, row


def status_from(fleet: Fleet, host: ChronosHost) -> dict[str, Any] | str:
    """`chronos status --json` on `host`, with the install page's function (or what it said when it failed)."""
    done = fleet.hosts.on(host, fleet.hosts.chronos_function() + "chronos status --json", check=False, timeout=30)
    if done.returncode != 0:
        return f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    try:
        view = orjson.loads(done.stdout)
    except ValueError:
        return done.stdout[-300:]
    keep = ("waiting", "due", "in_flight", "held_by", "suspected", "postgres")
    return {k: v for k, v in view.items() if k in keep} if isinstance(view, dict) else view


RUNNERS: dict[str, Callable[..., ScenarioResult]] = {
    "primary": primary_cut,
    "host": lambda fleet, **kw: host_cut(fleet, peers="all", **kw),
    "host-db": lambda fleet, **kw: host_cut(fleet, peers="db", **kw),
    "host-kafka": lambda fleet, **kw: host_cut(fleet, peers="kafka", **kw),
    "kafka": kafka_cut,
    "primary-out": lambda fleet, **kw: primary_cut(fleet, outbound_only=True, **kw),
}

__all__ = ["SCENARIOS", "RUNNERS", "FleetScenario", "Watch", "LATE_S"]

"""The consumer with cells, on in-memory cells and Kafka doubles: each message written to the cell of its input
partition, fenced by the map; a map gone stale (a partition moved) refused and read again; a moving partition's
messages held until the map says where it went; an input topic of another partition count refused."""

from __future__ import annotations

import re
import threading
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaError

from chronos.adapters.kafka.clients import OutageLog
from chronos.adapters.memory import MemoryDatabase, MemoryStore
from chronos.domain.cells import CellMapError
from chronos.errors import StoreRejected, StoreUnavailable
from chronos.runtime.process import Lifecycle
from chronos.telemetry.metrics import ConsumerTelemetry
from chronos.roles.consumer import ConsumerProcess
from kafka_double import FakeMessage, FakePublisher, settings
from test_roles_consumer import Clock, FakeConsumer, hdrs, in_1h_ms, logged, wait_for

CELLS = "a=postgresql://unused@127.0.0.1:1/a b=postgresql://unused@127.0.0.1:1/b"


class MapReadsCounted(MemoryStore):
    """A cell's store that counts the consumer's readings of the cell's list."""

    reads = 0

    def cell_partitions(self):
        self.reads += 1
        return super().cell_partitions()


class Hangs(MapReadsCounted):
    """A cell's store whose writes hang while `hung` is set (a frozen server: no answer, no error), until
    released."""

    def __init__(self, db, node_id=None):
        super().__init__(db, node_id=node_id)
        self.hung = threading.Event()
        self.notes = 0  # the consumer's words of the cells it reaches, said here
        self.released = threading.Event()
        self.writes_ended = 0

    tries = 0  # the writes begun

    def apply(self, *args, **kwargs):
        self.tries += 1
        if self.hung.is_set():
            assert self.released.wait(30), "never released"
        try:
            return super().apply(*args, **kwargs)
        finally:
            self.writes_ended += 1

    notes_held: threading.Event | None = None  # set to an event: the word is said only once it is set
    note_waits = 0  # the words held so far

    def note_reach(self, *args, **kwargs):
        held = self.notes_held
        if held is not None:
            self.note_waits += 1
            assert held.wait(30), "never let through"
        try:
            return super().note_reach(*args, **kwargs)
        finally:
            self.notes += 1

    probes_held: threading.Event | None = None  # set to an event: the time is asked only once it is set
    asked = failed = 0  # the times asked, and of those the ones that failed

    def db_clock_us(self):
        self.asked += 1
        held = self.probes_held
        if held is not None:
            assert held.wait(30), "never let through"
        try:
            return super().db_clock_us()
        except StoreUnavailable:
            self.failed += 1
            raise


class CellsConsumer:
    """A consumer process over two in-memory cells, a (partitions 0 and 1) and b (2 and 3), run on a thread."""

    def __init__(self, partitions: int = 4, assign: bool = True, clock=time.monotonic):
        self.dbs = {"a": MemoryDatabase(), "b": MemoryDatabase()}
        self.stores = {cell: MemoryStore(db) for cell, db in self.dbs.items()}
        if assign:
            self.stores["a"].open_partitions([0, 1], 1)
            self.stores["b"].open_partitions([2, 3], 1)
        self.publisher = FakePublisher()
        self.publisher.topic_partitions = {"in": partitions}
        self.settings = settings(CHRONOS_CELLS=CELLS, CHRONOS_INPUT_TOPIC="in")
        self.life = Lifecycle()
        self.input: FakeConsumer | None = None

        def consumers(on_commit):
            self.input = FakeConsumer(on_commit, snapshot=self.rows)
            return self.input, OutageLog("test consumer")
        # each cell's store is its writer's; the test reads and moves the map through handles of its own
        self.node = uuid.uuid4()
        self.cell_stores = {cell: Hangs(db, self.node) for cell, db in self.dbs.items()}
        self.proc = ConsumerProcess(self.settings, self.life, store=self.cell_stores["a"],
                                    producers=self.publisher.factory(), consumers=consumers,
                                    telemetry=ConsumerTelemetry(self.node, self.settings),
                                    watchers=lambda: self.input, cells=self.cell_stores, clock=clock)
        self.thread = threading.Thread(target=self.proc.run)

    def rows(self) -> dict[str, list[str]]:
        return {cell: sorted(db.rows) for cell, db in self.dbs.items()}

    def __enter__(self) -> "CellsConsumer":
        self.thread.start()
        wait_for(lambda: self.input is not None and self.input.subscribed, "the consumer to subscribe")
        return self

    def __exit__(self, *exc) -> None:
        self.life.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


def msg(mid: str, partition: int, offset: int, action: str | None = None) -> FakeMessage:
    return FakeMessage(hdrs(mid, None if action == "cancel" else in_1h_ms(), action), partition=partition,
                       offset=offset)


def test_each_message_is_written_to_its_partitions_cell_and_the_poll_committed_once_all_are_durable():
    with CellsConsumer() as c:
        assert c.input is not None
        c.input.feed([msg("m0", 0, 10), msg("m1", 1, 20), msg("m2", 2, 30), msg("m3", 3, 40), msg("m0b", 0, 11)])
        wait_for(lambda: c.input.commits, "the commit")
        offsets, stored_then = c.input.commits[0]
        assert stored_then == {"a": ["m0", "m0b", "m1"], "b": ["m2", "m3"]}
        assert offsets == {("in", 0): 12, ("in", 1): 21, ("in", 2): 31, ("in", 3): 41}
        # a cancel read from a message's partition finds it in that partition's cell
        c.input.feed([msg("m2", 2, 31, "cancel")])
        wait_for(lambda: len(c.input.commits) == 2, "the second commit")
        assert c.rows() == {"a": ["m0", "m0b", "m1"], "b": ["m3"]}
    assert c.proc.stats["enqueued"] == 5 and c.proc.stats["cancelled"] == 1


def test_a_write_on_a_stale_map_is_refused_and_goes_where_the_map_now_says():
    with CellsConsumer() as c:
        assert c.input is not None
        c.input.feed([msg("before", 1, 0)])
        wait_for(lambda: c.input.commits, "the first commit")
        # partition 1 moves from a to b behind the consumer's back
        assert c.stores["a"].close_partitions([1]) == {1: 2}
        c.stores["b"].open_partitions([1], 3)
        c.input.feed([msg("after", 1, 1), msg("other", 0, 5)])
        wait_for(lambda: len(c.input.commits) == 2, "the second commit")
        assert c.input.commits[1][1] == {"a": ["before", "other"], "b": ["after"]}


def test_a_moving_partition_is_paused_until_another_cell_opens_it_while_the_others_flow(caplog):
    caplog.set_level("INFO", logger="chronos.consumer")
    with CellsConsumer() as c:
        assert c.input is not None
        c.input.feed([msg("before", 1, 0)])
        wait_for(lambda: c.input.commits, "the first commit")
        c.stores["a"].close_partitions([1])  # moving, opened nowhere yet: the consumer's next write is refused
        c.input.feed([msg("held", 1, 1), msg("flows", 2, 0), msg("also", 0, 7)])
        wait_for(lambda: len(c.input.commits) == 2, "the other partitions committed")
        assert c.input.commits[1] == ({("in", 0): 8, ("in", 2): 1}, {"a": ["also", "before"], "b": ["flows"]})
        assert c.input.paused == {("in", 1)} and c.input.seeks == [{("in", 1): 1}]
        assert logged(caplog, "input partition(s) 1 are moving to another cell: paused until it opens them")
        # read before the pause took: held back too, never sought forward; the others go on meanwhile
        c.input.feed([msg("held-later", 1, 2), msg("flows-later", 3, 0)])
        wait_for(lambda: len(c.input.commits) == 3, "the next commit")
        assert c.input.commits[2][0] == {("in", 3): 1} and c.input.seeks == [{("in", 1): 1}]
        reads = c.cell_stores["a"].reads
        wait_for(lambda: c.cell_stores["a"].reads >= reads + 2, "the map read again, twice: still moving")
        assert c.input.resumed == []
        c.stores["b"].open_partitions([1], 3)
        wait_for(lambda: c.input.resumed, "partition 1 resumed once b opens it")
        assert c.input.resumed == [("in", 1)] and c.input.paused == set()
        assert logged(caplog, "input partition 1 is open in cell b at epoch 3: read again after")
        # read again from where it was sought back to: into b
        c.input.feed([msg("held", 1, 1), msg("held-later", 1, 2)])
        wait_for(lambda: len(c.input.commits) == 4, "partition 1 committed")
        assert c.input.commits[3] == ({("in", 1): 3}, {"a": ["also", "before"],
                                                        "b": ["flows", "flows-later", "held", "held-later"]})


def test_a_poll_sorted_on_the_map_before_the_last_write_read_it_again_goes_where_the_map_now_says(caplog):
    """The loop sorts a poll by cell while the last poll is written; that write, refused, reads the map again (a
    partition moving). The poll sorted on the map before goes by the map read since: the moving partition's
    messages held back, the others written, the consumer running on."""
    caplog.set_level("INFO", logger="chronos.consumer")
    with CellsConsumer() as c:
        assert c.input is not None
        c.input.feed([msg("before", 1, 0)])
        wait_for(lambda: c.input.commits, "the first commit")
        a = c.cell_stores["a"]
        tries = a.tries
        a.hung.set()
        c.input.feed([msg("first", 1, 1)])
        wait_for(lambda: a.tries > tries, "the first poll's write under way (hung)")
        assert c.proc.cells is not None
        sort, sorted_ = c.proc.cells.sort, threading.Event()

        def sort_and_say(*args):
            batches = sort(*args)
            sorted_.set()
            return batches
        c.proc.cells.sort = sort_and_say  # type: ignore[method-assign]
        c.input.feed([msg("second", 1, 2), msg("other", 0, 5), msg("flows", 2, 0)])
        assert sorted_.wait(10), "the second poll never sorted"
        c.stores["a"].close_partitions([1])  # moving, opened nowhere yet
        a.hung.clear()
        a.released.set()
        wait_for(lambda: len(c.input.commits) == 2, "the other partitions committed")
        assert c.thread.is_alive()
        assert c.input.commits[1] == ({("in", 0): 6, ("in", 2): 1}, {"a": ["before", "other"], "b": ["flows"]})
        assert c.input.paused == {("in", 1)} and c.input.seeks == [{("in", 1): 1}]
        assert logged(caplog, "input partition(s) 1 are moving to another cell: paused until it opens them")


def test_an_input_topic_of_another_partition_count_than_the_maps_is_refused():
    c = CellsConsumer(partitions=6)
    with pytest.raises(CellMapError, match="input topic in has 6 partitions, and the cell map assigns 4"):
        c.proc.run()
    unassigned = CellsConsumer(assign=False)  # two cells, nothing assigned: no map at all
    with pytest.raises(CellMapError, match="no cell of a, b lists any input partition"):
        unassigned.proc.run()


def test_a_cell_that_does_not_answer_has_its_partitions_paused_and_read_again_while_the_others_flow(caplog):
    caplog.set_level("WARNING", logger="chronos.consumer")
    with CellsConsumer() as c:
        assert c.input is not None
        c.dbs["b"].unavailable = "connection refused"
        c.input.feed([msg("a0", 0, 10), msg("b2", 2, 30), msg("b3", 3, 40)])
        wait_for(lambda: c.input.commits, "the commit of what cell a took")
        assert c.input.commits[0] == ({("in", 0): 11}, {"a": ["a0"], "b": []})
        assert c.input.paused == {("in", 2), ("in", 3)} and c.input.seeks == [{("in", 2): 30, ("in", 3): 40}]
        assert logged(caplog, "cell b does not answer: its partitions are paused")
        # read before the pause took: held back too, never sought forward; cell a's partitions flow on
        c.input.feed([msg("a1", 1, 20), msg("b2-later", 2, 31)])
        wait_for(lambda: len(c.input.commits) == 2, "the next commit")
        assert c.input.commits[1] == ({("in", 1): 21}, {"a": ["a0", "a1"], "b": []})
        assert c.input.seeks == [{("in", 2): 30, ("in", 3): 40}]
        c.dbs["b"].unavailable = None
        wait_for(lambda: c.input.resumed, "cell b's partitions resumed")
        assert sorted(c.input.resumed) == [("in", 2), ("in", 3)] and c.input.paused == set()
        assert logged(caplog, "cell b answers again after")
        # read again from where they were sought back to
        c.input.feed([msg("b2", 2, 30), msg("b2-later", 2, 31), msg("b3", 3, 40)])
        wait_for(lambda: len(c.input.commits) == 3, "cell b's part committed")
        assert c.input.commits[2] == ({("in", 2): 32, ("in", 3): 41}, {"a": ["a0", "a1"], "b": ["b2", "b2-later", "b3"]})
        assert c.input.group == ["subscribe"]


@pytest.mark.parametrize("others_commit_on,leaves", [((2,), True), ((0, 1), False)],
                         ids=["another-consumer-reaches-the-cell", "the-others-commit-elsewhere-only"])
def test_the_consumer_leaves_the_group_only_when_another_reaches_the_cell_it_cannot(caplog, others_commit_on, leaves):
    clock = Clock()
    with CellsConsumer(clock=clock) as c:
        assert c.input is not None
        c.input.group_offsets = {}
        c.dbs["b"].unavailable = "connection refused"
        c.input.feed([msg("b3", 3, 40)])
        wait_for(lambda: c.input.paused, "cell b's partition paused")
        c.input.group_offsets = {p: 100 for p in others_commit_on}  # another consumer committed there since
        reads = c.input.progress_reads
        clock.advance(c.settings.hold_time_ms / 1000.0 + 0.1)
        wait_for(lambda: c.input.progress_reads > reads, "the others' progress read past the hold time")
        if leaves:
            wait_for(lambda: c.input.group[-1] == "unsubscribe", "the consumer to leave the group")
            wait_for(lambda: logged(caplog, "cannot reach PostgreSQL of cell b for"), "the leaving said")  # just after
        else:
            c.input.feed([msg("a0", 0, 10)])
            wait_for(lambda: c.input.commits, "cell a's partitions flowing")
            assert c.input.group == ["subscribe"]


def test_each_consumer_says_in_every_cell_it_reaches_which_cells_it_reaches():
    with CellsConsumer() as c:
        wait_for(lambda: all(len(db.reach) == 2 for db in c.dbs.values()), "each cell told that it reaches both")
        assert {key[:2] for db in c.dbs.values() for key in db.reach} == {("chronos", c.node)}
        c.dbs["b"].unavailable = "connection refused"
        notes = c.cell_stores["a"].notes
        wait_for(lambda: c.cell_stores["a"].notes >= notes + 2, "two more words in cell a, a second apart")
        said = {cell: at for (_, _, cell), at in c.dbs["a"].reach.items()}
        # cell a says that it reached a just now, and b no later than before b went down, a second ago at least
        assert said["a"] - said["b"] > 900_000, said


def test_a_cell_that_refuses_the_word_of_the_cells_reached_is_said_once_and_its_writes_go_on(caplog):
    caplog.set_level("WARNING", logger="chronos.consumer")
    c = CellsConsumer()
    refused = []

    def refuse(group, reached):
        refused.append(reached)
        raise StoreRejected("permission denied for table chronos_consumer_reach")
    c.cell_stores["b"].note_reach = refuse
    with c:
        assert c.input is not None
        wait_for(lambda: len(refused) >= 2, "the word said twice, a second apart")
        c.input.feed([msg("b2", 2, 30)])
        wait_for(lambda: c.input.commits, "cell b's partition written and committed")
        assert c.rows()["b"] == ["b2"]
    assert sum("cell b refuses this consumer's word" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("other_says,leaves", [({"a": 0, "b": 0}, True), ({"a": 0}, False),
                                               ({"a": 0, "b": 60_000}, False)],
                         ids=["another-consumer-reaches-the-cell", "the-cell-is-down-for-all",
                              "the-other-reached-it-before-it-went-down"])
def test_a_consumer_alone_cut_off_from_a_cell_that_another_reaches_leaves_the_group(caplog, other_says, leaves):
    """This consumer holds every partition of cell b, so no other consumer commits there: what the others say in
    cell a, which it reaches, decides."""
    caplog.set_level("WARNING", logger="chronos.consumer")
    clock = Clock()
    with CellsConsumer(clock=clock) as c:
        cell_b_lost(c)  # no other consumer commits anywhere
        MemoryStore(c.dbs["a"], node_id=uuid.uuid4()).note_reach("chronos", other_says)  # the other consumer's word
        MemoryStore(c.dbs["a"], node_id=uuid.uuid4()).note_reach("another group", {"b": 0})  # not of its group
        notes, reads = c.cell_stores["a"].notes, c.input.progress_reads
        clock.advance(c.settings.hold_time_ms / 1000.0 + 0.1)
        wait_for(lambda: c.cell_stores["a"].notes > notes and c.input.progress_reads > reads,
                 "cell a read and the others' progress looked at past the hold time")
        if leaves:
            wait_for(lambda: c.input.group[-1] == "unsubscribe", "the consumer to leave the group")
            wait_for(lambda: logged(caplog, "cannot reach PostgreSQL of cell b for"), "the leaving said")  # just after
            # 5.1 s by the test's clock, less the age the cell gave the other's word when read (real milliseconds)
            said = logged(caplog, "another consumer of group chronos reached cell b ")
            assert said and re.search(r"reached cell b (4\.[5-9]|5\.[01])s after this one lost it", said[0]), said
        else:
            wait_for(lambda: logged(caplog, "cell b has not answered for the hold time, and no other consumer of "
                                            "group chronos has reached it since: staying in the group"), "the stay said")
            c.input.feed([msg("a0", 0, 10)])
            wait_for(lambda: c.input.commits, "cell a's partitions flowing")
            assert c.input.group == ["subscribe"]


@pytest.mark.parametrize("answers", [True, False], ids=["the-cell-is-back-for-all", "it-alone-cannot-reach-it"])
def test_a_consumer_leaves_for_a_cell_another_reaches_only_once_its_own_try_since_failed(caplog, answers):
    """A failover that ends brings the cell back for every consumer, one of them first: the others do not leave
    the group for it on that one's word, but ask the cell themselves (here the try under way, held until the
    word is read, then again at once) and leave only if a try begun after the word fails."""
    caplog.set_level("WARNING", logger="chronos.consumer")
    clock = Clock()
    with CellsConsumer(clock=clock) as c:
        held = cell_b_lost(c).probes_held = threading.Event()  # no other consumer commits anywhere
        clock.advance(c.settings.hold_time_ms / 1000.0 + 0.1)  # past the hold time; the next probe asked, held
        wait_for(lambda: logged(caplog, "cell b has not answered for the hold time"), "the stay said")
        MemoryStore(c.dbs["a"], node_id=uuid.uuid4()).note_reach("chronos", {"a": 0, "b": 0})  # the other's word
        for more in (1, 2):  # the second word said once the first's answer was taken in, and looked at
            notes = c.cell_stores["a"].notes
            clock.advance(1.0)
            wait_for(lambda: c.cell_stores["a"].notes > notes, f"word {more} in cell a since the other's")
        assert c.input.group == ["subscribe"]  # the probe under way has not failed since
        if answers:
            c.dbs["b"].unavailable = None
        held.set()
        if answers:
            wait_for(lambda: logged(caplog, "cell b answers again after"), "cell b's partitions resumed")
            assert c.input.paused == set() and c.input.group == ["subscribe"]
        else:
            wait_for(lambda: c.input.group[-1] == "unsubscribe", "the consumer to leave the group")
            assert logged(caplog, "after this one lost it, and this one has not reached it since: this one alone "
                                  "cannot reach it")


def cell_b_lost(c: CellsConsumer) -> Any:
    """Cell b refuses every connection, and the consumer has paused its partition (no other consumer commits
    anywhere): b's store."""
    assert c.input is not None
    c.input.group_offsets = {}
    b = c.cell_stores["b"]
    wait_for(lambda: c.cell_stores["a"].notes, "the consumer's first word in cell a")
    c.dbs["b"].unavailable = "connection refused"
    c.input.feed([msg("b3", 3, 40)])
    wait_for(lambda: c.input.paused and b.failed, "cell b's partition paused, and its first try failed")
    return b


def another_reached_b(c: CellsConsumer, clock: Clock) -> int:
    """Another consumer says in cell a that it reaches cell b, and this one has read it: its notes since."""
    MemoryStore(c.dbs["a"], node_id=uuid.uuid4()).note_reach("chronos", {"a": 0, "b": 0})  # the other's word
    notes = c.cell_stores["a"].notes
    clock.advance(1.1)
    wait_for(lambda: c.cell_stores["a"].notes > notes, "the other's word read in cell a")
    return c.cell_stores["a"].notes


def test_a_cells_part_of_a_poll_queued_behind_a_statement_that_found_it_out_of_reach_gives_up_without_a_try(caplog):
    """A cell's statements run on its one thread: when one of them (here the word of reach) hangs until the cell
    is out of reach and fails, the poll's part queued behind it gives up at once and the cell's partitions are
    paused, rather than after a try of its own, which, on a network that drops the packets, waits out a
    connection's deadline of its own first."""
    caplog.set_level("WARNING", logger="chronos.consumer")
    with CellsConsumer() as c:
        assert c.input is not None
        b = c.cell_stores["b"]
        wait_for(lambda: b.notes, "the consumer's first word in cell b")
        held = b.notes_held = threading.Event()
        wait_for(lambda: b.note_waits, "a word in cell b under way, held")
        thread, handed = c.proc.cells.threads["b"], []
        submit = thread.submit
        thread.submit = lambda fn, *args, **kwargs: (handed.append(fn.__name__), submit(fn, *args, **kwargs))[1]
        c.dbs["b"].unavailable = "connection dropped"
        tries = b.tries
        c.input.feed([msg("b3", 3, 40)])
        wait_for(lambda: "store_batch" in handed, "the poll's part handed to cell b's thread, behind the word")
        held.set()
        wait_for(lambda: logged(caplog, "cell b does not answer"), "cell b's partitions paused")
        assert b.tries == tries and c.input.paused


def test_a_consumer_whose_tries_hang_leaves_once_the_hold_time_has_passed_since_another_reached_the_cell(caplog):
    """On a network that drops this host's packets to the cell, a try hangs for seconds (here for good): the
    consumer leaves once another has reached the cell the hold time ago, this one still waiting for an answer."""
    caplog.set_level("WARNING", logger="chronos.consumer")
    clock = Clock()
    with CellsConsumer(clock=clock) as c:
        b = cell_b_lost(c)
        held = b.probes_held = threading.Event()  # every try from now on hangs
        try:
            notes = another_reached_b(c, clock)
            clock.advance(c.settings.hold_time_ms / 1000.0)
            # the consumer leaves the group, then says so: the words awaited, not only the leaving
            wait_for(lambda: re.search(r"cannot reach PostgreSQL of cell b for \d+\.\ds", caplog.text),
                     f"the consumer to say it leaves the group ({notes} notes in cell a)")
            assert c.input.group[-1] == "unsubscribe"
        finally:
            held.set()


def test_a_try_begun_after_the_first_word_of_another_reaching_the_cell_counts_not_only_after_the_latest(caplog):
    """The others say every second that they reach the cell: the try that counts is one begun after the first
    word since this consumer lost the cell (here held, then failed), or one that hangs for seconds would never
    count."""
    caplog.set_level("WARNING", logger="chronos.consumer")
    clock = Clock()
    with CellsConsumer(clock=clock) as c:
        b = cell_b_lost(c)
        held = b.probes_held = threading.Event()
        asked = b.asked
        another_reached_b(c, clock)
        clock.advance(0.5)  # past the backoff of the first try, whenever its failure was taken in
        wait_for(lambda: b.asked > asked, "a try asked, held")
        failed, b.probes_held = b.failed, threading.Event()  # the next try hangs for good
        held.set()
        wait_for(lambda: b.failed > failed, "the held try failed")
        notes = c.cell_stores["a"].notes
        clock.advance(c.settings.hold_time_ms / 1000.0 - 2.0)  # the other's word read again, later
        wait_for(lambda: c.cell_stores["a"].notes > notes, "the other's word read again")
        clock.advance(1.0)  # past the hold time
        wait_for(lambda: c.input.group[-1] == "unsubscribe", "the consumer to leave the group at the hold time")
        assert logged(caplog, "after this one lost it, and this one has not reached it since: this one alone "
                              "cannot reach it")
        b.probes_held.set()


def test_a_consumer_that_left_for_a_cell_reads_its_paused_partitions_again_once_back_in_the_group(caplog):
    """The client keeps a partition's pause through leaving the group and joining it again (as librdkafka does):
    what the consumer paused, for the cell it left for and for a move, is resumed as it leaves, or the partitions
    assigned back to it on rejoining would never be read again."""
    caplog.set_level("WARNING", logger="chronos.consumer")
    clock = Clock()
    with CellsConsumer(clock=clock) as c:
        assert c.input is not None
        c.input.group_offsets = {}
        c.stores["a"].close_partitions([1])  # moving: paused until a cell opens it
        c.input.feed([msg("held", 1, 0)])
        wait_for(lambda: c.input.paused, "partition 1 paused")
        c.dbs["b"].unavailable = "connection refused"
        c.input.feed([msg("b3", 3, 40)])
        wait_for(lambda: ("in", 3) in c.input.paused, "cell b's partition paused")
        assert c.input.paused == {("in", 1), ("in", 3)}
        MemoryStore(c.dbs["a"], node_id=uuid.uuid4()).note_reach("chronos", {"a": 0, "b": 0})  # another reaches b
        clock.advance(c.settings.hold_time_ms / 1000.0 + 0.1)
        wait_for(lambda: c.input.group[-1] == "unsubscribe", "the consumer to leave the group")
        c.dbs["b"].unavailable = None
        wait_for(lambda: c.input.group[-1] == "subscribe", "the consumer to rejoin once cell b answers")
        assert c.input.group == ["subscribe", "unsubscribe", "subscribe"]
        assert c.input.paused == set()


def test_a_partition_moving_for_long_is_said_in_the_log(caplog):
    caplog.set_level("WARNING", logger="chronos.consumer")
    clock = Clock()
    with CellsConsumer(clock=clock) as c:
        assert c.input is not None
        c.stores["a"].close_partitions([1])
        c.input.feed([msg("held", 1, 0)])
        wait_for(lambda: c.input.paused, "partition 1 paused")
        clock.advance(31)
        wait_for(lambda: logged(caplog, "input partition 1 has been moving for 30s and no cell this consumer knows "
                                        "opened it: finish its move (chronos cells move)"), "the warning")


def test_a_cancel_or_replace_arriving_in_another_cell_than_its_message_is_forwarded_there(caplog):
    caplog.set_level("INFO", logger="chronos.consumer")
    with CellsConsumer() as c:
        assert c.input is not None
        c.input.feed([msg("x", 0, 0), msg("y", 1, 0)])
        wait_for(lambda: c.input.commits, "the messages written in cell a")
        # their cancel and replace read from partitions of cell b (a producer that does not route by the id)
        c.input.feed([msg("x", 2, 0, "cancel"), msg("y", 3, 0, "replace"), msg("nowhere", 2, 1, "cancel")])
        wait_for(lambda: len(c.input.commits) == 2, "the second commit")
        wait_for(lambda: c.proc.stats["forwarded"] == 2, "the cancel and the replace forwarded")
        assert c.rows() == {"a": [], "b": ["y"]}  # x cancelled; y's new version in b, its old one gone from a
        assert logged(caplog, "forwarded 3 cancels and replaces from cell b: 2 reached their message in another cell")
        assert c.dbs["b"].forwards == {}  # forwarded to every other cell: forgotten
    assert c.proc.stats["cancelled"] == 1 and c.proc.stats["cancel_unknown"] == 1


def test_a_forward_waits_for_a_cell_that_does_not_answer():
    with CellsConsumer() as c:
        assert c.input is not None
        c.input.feed([msg("x", 0, 0)])
        wait_for(lambda: c.input.commits, "x written in cell a")
        c.dbs["a"].unavailable = "connection refused"
        c.input.feed([msg("x", 2, 0, "cancel")])
        wait_for(lambda: len(c.input.commits) == 2, "the cancel's own write committed")
        assert list(c.dbs["b"].forwards) == ["x"] and "x" in c.dbs["a"].rows  # noted, waiting for cell a
        c.dbs["a"].unavailable = None
        wait_for(lambda: "x" not in c.dbs["a"].rows, "the cancel forwarded once cell a answers")
        wait_for(lambda: c.dbs["b"].forwards == {}, "the forward forgotten")
        assert c.proc.stats["forwarded"] == 1


def test_a_message_no_topic_took_is_parked_in_its_partitions_cell():
    with CellsConsumer() as c:
        assert c.input is not None
        c.publisher.refuse = lambda topic, value: KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)  # nor the dead-letter topic
        c.input.feed([FakeMessage([("chronosDeadline", b"soon")], partition=3, offset=5)])  # invalid: no id
        wait_for(lambda: c.input.commits, "the commit once parked")
        assert [p.message.source for p in c.dbs["b"].parked] == ["in/3/5"] and c.dbs["a"].parked == []


def test_a_hung_cell_does_not_hold_up_the_others_for_the_statements_deadline(caplog):
    """Cell b's write hangs (no answer, no error, as a frozen server's): cell a's part of the poll is committed
    within the patience, not the statement's deadline, and b's partitions are paused; once b answers, its write
    given up ends and its messages, read again, are written again (idempotently) and committed."""
    caplog.set_level("INFO", logger="chronos.consumer")
    with CellsConsumer() as c:
        assert c.input is not None
        b = c.cell_stores["b"]
        b.hung.set()
        c.input.feed([msg("a0", 0, 10), msg("b2", 2, 30)])
        wait_for(lambda: c.input.commits, "the commit of what cell a took")
        assert c.input.commits[0] == ({("in", 0): 11}, {"a": ["a0"], "b": []})
        assert b.writes_ended == 0  # b's write still hangs: a did not wait for its deadline
        assert c.input.paused == {("in", 2)} and c.input.seeks == [{("in", 2): 30}]
        assert logged(caplog, "cell b has not answered within 0.5s of the other cells")
        # a's partitions flow on while b hangs
        c.input.feed([msg("a1", 1, 20)])
        wait_for(lambda: len(c.input.commits) == 2, "the next commit")
        assert c.input.commits[1] == ({("in", 1): 21}, {"a": ["a0", "a1"], "b": []})
        b.hung.clear()
        b.released.set()
        wait_for(lambda: c.input.resumed, "cell b's partitions resumed once it answers")
        c.input.feed([msg("b2", 2, 30)])
        wait_for(lambda: len(c.input.commits) == 3, "cell b's part committed")
        assert c.input.commits[2] == ({("in", 2): 31}, {"a": ["a0", "a1"], "b": ["b2"]})


def test_a_cancel_to_forward_to_a_hung_cell_holds_up_the_forwarding_not_the_poll():
    with CellsConsumer() as c:
        assert c.input is not None
        b = c.cell_stores["b"]
        c.input.feed([msg("x", 2, 0)])
        wait_for(lambda: c.input.commits, "x written in cell b")
        b.hung.set()
        # x's cancel read in cell a's partition (forwarded to b, whose thread the hung write holds) and a write to b
        c.input.feed([msg("x", 0, 0, "cancel"), msg("b3", 3, 0)])
        wait_for(lambda: len(c.input.commits) == 2, "cell a's part committed while b hangs")
        c.input.feed([msg("a1", 1, 0)])
        wait_for(lambda: len(c.input.commits) == 3, "cell a's next poll committed while b hangs")
        assert "x" in c.dbs["b"].rows and c.proc.stats["forwarded"] == 0
        b.hung.clear()
        b.released.set()
        wait_for(lambda: c.proc.stats["forwarded"] == 1, "the cancel forwarded once b answers")
        assert "x" not in c.dbs["b"].rows


def test_a_word_of_reach_queued_behind_a_write_that_found_the_cell_out_of_reach_gives_up_without_a_try():
    """The word of reach waits on the cell's thread behind a write that hangs, then fails: it is not tried (a try
    would open a connection first, and on a network that drops the packets wait out its connect timeout, while
    the next poll's part and the cell's probe wait behind it)."""
    clock = Clock()
    with CellsConsumer(clock=clock) as c:
        assert c.input is not None
        b = c.cell_stores["b"]
        wait_for(lambda: b.notes, "the consumer's first word in cell b")
        thread, handed = c.proc.cells.threads["b"], {}
        submit = thread.submit

        def noted(fn, *args, **kwargs):
            future = submit(fn, *args, **kwargs)
            handed.setdefault(getattr(fn, "__name__", ""), []).append(future)
            return future
        thread.submit = noted
        b.hung.set()
        tries = b.tries
        c.input.feed([msg("b3", 3, 40)])
        wait_for(lambda: b.tries > tries, "cell b's part of the poll under way, hung")
        clock.advance(1.1)
        wait_for(lambda: "say" in handed, "the next word in cell b queued behind the write")
        notes = b.notes
        c.dbs["b"].unavailable = "connection dropped"
        b.released.set()
        wait_for(lambda: all(f.done() for f in handed["say"]), "the queued word to end")
        assert b.notes == notes
        wait_for(lambda: c.input.paused == {("in", 3)}, "cell b's partition paused")


def test_a_cell_whose_word_of_reach_found_it_out_of_reach_is_paused_without_a_write_and_probed(caplog):
    """Idle, the consumer's word of reach (or its idle probe) finds cell b out of reach: b is followed as a cell
    that does not answer at once, so a message read for it next is held back without a try (its probe is what
    tries b), and b's partition is read again once b answers the probe."""
    caplog.set_level("WARNING", logger="chronos.consumer")
    clock = Clock()
    with CellsConsumer(clock=clock) as c:
        assert c.input is not None
        b = c.cell_stores["b"]
        wait_for(lambda: b.notes, "the consumer's first word in cell b")
        c.dbs["b"].unavailable = "connection refused"
        clock.advance(1.1)  # the next word is due (the idle probe may find b out of reach first: the same)
        wait_for(lambda: logged(caplog, "cell b does not answer"), "cell b followed as down")
        tries = b.tries
        c.input.feed([msg("b3", 3, 40)])
        wait_for(lambda: c.input.paused == {("in", 3)}, "cell b's partition paused")
        assert b.tries == tries
        c.dbs["b"].unavailable = None
        clock.advance(5.0)  # past the probe's backoff
        wait_for(lambda: c.input.resumed, "cell b's partition read again once b answers its probe")

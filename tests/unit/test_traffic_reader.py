"""The harness's reader of the output topic measures with the process's garbage collector off: a full
collection walks every object kept per message, and every read time waits for it (kits.traffic)."""

from __future__ import annotations

import gc
import time

from kits.traffic import CollectorOff, Reader

NOWHERE = "127.0.0.1:1"  # no broker: the readers only wait


def wait_readers(n: int) -> None:
    end = time.monotonic() + 10
    while CollectorOff._readers != n:
        assert time.monotonic() < end, f"{CollectorOff._readers} readers reading, not {n}"
        time.sleep(0.01)


def test_the_collector_is_off_while_any_reader_reads_and_on_again_after_the_last():
    assert gc.isenabled()
    first, second = Reader(NOWHERE, "out"), Reader(NOWHERE, "out")
    first.start()
    second.start()
    try:
        wait_readers(2)
        assert not gc.isenabled()
        first.stop()
        assert not gc.isenabled()  # the other still reads
    finally:
        first.stop()
        second.stop()
    assert CollectorOff._readers == 0 and gc.isenabled()


class OneFetch:
    """A consumer whose one fetch notes whether the collector is on, and stops its reader."""

    def __init__(self, reader: Reader):
        self.reader, self.collector_on = reader, []
        reader.consumer.close()
        reader.consumer = self

    def consume(self, num_messages: int, timeout: float) -> list:
        self.collector_on.append(gc.isenabled())
        self.reader._halt.set()
        return []

    def assignment(self) -> list:
        return []

    def close(self) -> None:
        pass


def test_a_reader_told_to_collect_garbage_leaves_the_collector_alone():
    collecting, measuring = Reader(NOWHERE, "out", collect_garbage=True), Reader(NOWHERE, "out")
    fetches = OneFetch(collecting), OneFetch(measuring)
    collecting.run()
    measuring.run()
    assert [f.collector_on for f in fetches] == [[True], [False]] and gc.isenabled()

"""What `chronos up` makes of its samples of the embedded broker: the memory warning, what a restart
lost, the stats file (chronos.embedded.watch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from chronos.embedded import watch
from chronos.adapters.kafka.brokerstats import read_stats
from chronos.embedded.watch import BrokerWatch, default_warning_bytes, loss_line

MB = 2 ** 20


@dataclass
class FakeOffsets:
    messages: int
    unread_input: int
    exact: bool = True

    def unread(self, topic: str) -> int:
        assert topic == "in"
        return self.unread_input


@dataclass
class Reader:
    answers: list = field(default_factory=list)
    closed: bool = False

    def read(self):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        self.closed = True


def make(tmp_path, reader: Reader, said: list, warning: int = 100 * MB) -> BrokerWatch:
    w = BrokerWatch(tmp_path / "stats.json", "in", reader=lambda: reader, say=said.append, warning_bytes=warning)
    w.started(None, 9092)
    return w


def test_a_restart_reports_the_last_sample_and_counts_the_loss(tmp_path):
    from chronos.errors import UnavailableError
    reader, said = Reader([FakeOffsets(1000, 40), UnavailableError("down")]), []
    w = make(tmp_path, reader, said)
    w.sample()
    w.sample()  # the broker no longer answers: the last known figures stay
    assert read_stats(w.path)["input_unread"] == 40
    line = w.restarted(123, "killed by SIGKILL", 456, 9092, w.stats.sampled_at + 7)
    assert line.startswith("the embedded broker (pid 123) stopped unexpectedly (killed by SIGKILL); started again "
                           "on port 9092; it kept messages in memory only: about 40 input messages not yet read by "
                           "the consumer group were lost (last seen ")
    assert "7s before; 1,000 messages on all its topics" in line
    assert line.endswith("messages waiting in PostgreSQL are safe and fire as the programs start again")
    stats = read_stats(w.path)
    assert (stats["restarts"], stats["lost_input"], stats["pid"], stats["input_unread"]) == (1, 40, 456, None)
    assert stats["last_restart"]["lost_input"] == 40 and stats["last_restart"]["old_pid"] == 123
    w.close()
    assert reader.closed and not w.path.exists()


def test_a_loss_known_only_as_a_lower_bound_says_so():
    stats = watch.BrokerStats(messages=10, input_unread=3, exact=False, sampled_at=100.0)
    assert "at least 3 input messages" in loss_line(1, "exit code 1", 2, stats, 101.0)
    never = loss_line(1, "exit code 1", 2, watch.BrokerStats(), 101.0)
    assert "is unknown (never sampled)" in never and "about" not in never


def test_memory_warning_above_the_threshold_and_again_after_half_as_much_again(tmp_path, monkeypatch):
    rss = {"now": 50 * MB}
    monkeypatch.setattr(watch, "rss_bytes", lambda pid: rss["now"])
    said: list[str] = []
    w = make(tmp_path, Reader([FakeOffsets(7, 0)] * 5), said)
    w.started(42, 9092)
    w.sample()
    assert said == []
    rss["now"] = 120 * MB
    w.sample()
    assert len(said) == 1 and "(pid 42) uses 120 MB of memory holding 7 messages, above the warning threshold " \
                               "of 100 MB" in said[0]
    rss["now"] = 170 * MB
    w.sample()
    assert len(said) == 1  # not yet 1.5 x 120 MB
    rss["now"] = 180 * MB
    w.sample()
    assert len(said) == 2
    assert read_stats(w.path)["rss_bytes"] == 180 * MB


def test_samples_wait_their_turn(tmp_path):
    reader = Reader([FakeOffsets(1, 1), FakeOffsets(2, 2)])
    w = make(tmp_path, reader, [])
    w.tick(100.0)
    w.tick(104.9)
    assert read_stats(w.path)["messages"] == 1
    w.tick(105.0)
    assert read_stats(w.path)["messages"] == 2


def test_default_threshold_and_unreadable_stats(tmp_path):
    assert default_warning_bytes(None) == 2 * 1024 * MB
    assert default_warning_bytes(64 * 1024 * MB) == 2 * 1024 * MB
    assert default_warning_bytes(1024 * MB) == 512 * MB
    assert read_stats(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert read_stats(tmp_path / "bad.json") is None

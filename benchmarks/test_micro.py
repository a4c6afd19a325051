"""Micro benchmarks of the hot paths (`make bench`): the header codec, batch insert, claim and delete,
and the consumer's and the firer's batch paths per message (docs/benchmarks/hot-path.md).

Nothing here asserts a speed; the codec's native/pure-Python ratio is printed at the end of the
run and stored in each benchmark's `extra_info` (see `--benchmark-json`).
"""

from __future__ import annotations

import itertools
import time
import uuid

import pytest

from benchmarks.conftest import SPEEDUPS
from chronos import codec
from chronos.domain.model import Row
from chronos.adapters.postgres.store import Store

BATCH = 2000

# What a typical input message carries: the two Chronos headers and two of the application's.
INPUT_HEADERS = [
    ("chronosMessageId", b"order-7f3c2a1e-5b9d-4c8e-a0f1-2d3e4f5a6b7c"),
    ("chronosDeadline", b"2026-12-01T11:09:01.123+02:00"),
    ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ("content-type", b"application/json"),
]
# What the store keeps and the firer decodes: the relayed headers, a binary and a duplicate one.
STORED_HEADERS = [
    ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ("content-type", b"application/json"),
    ("blob", bytes(range(64))),
    ("content-type", b"text/plain"),
    ("empty", None),
]


def _impl(name: str):
    try:
        return codec.implementation(name)
    except ImportError as exc:
        pytest.skip(f"the {name} codec is not available: {exc}")


def _record(benchmark, op: str, impl: str) -> None:
    # the median: robust to the outliers a shared machine adds
    SPEEDUPS.setdefault(op, {})[impl] = benchmark.stats.stats.median
    means = SPEEDUPS[op]
    if "native" in means and "python" in means:
        benchmark.extra_info["native_speedup"] = round(means["python"] / means["native"], 2)


IMPLS = pytest.mark.parametrize("impl", ["native", "python"])


@IMPLS
def test_parse_headers(benchmark, impl):
    mod = _impl(impl)
    parsed = benchmark(mod.parse_headers, INPUT_HEADERS)
    assert parsed.message_id.startswith("order-")
    _record(benchmark, "parse_headers", impl)


@IMPLS
def test_encode_headers(benchmark, impl):
    mod = _impl(impl)
    data = benchmark(mod.encode_headers, STORED_HEADERS)
    assert mod.decode_headers(data) == STORED_HEADERS
    _record(benchmark, "encode_headers", impl)


@IMPLS
def test_decode_headers(benchmark, impl):
    mod = _impl(impl)
    data = mod.encode_headers(STORED_HEADERS)
    assert benchmark(mod.decode_headers, data) == STORED_HEADERS
    _record(benchmark, "decode_headers", impl)


# What the consumer reads per message from librdkafka's header list (the headers of INPUT_HEADERS).
RAW_HEADERS = [(k.encode(), v) for k, v in INPUT_HEADERS]


@IMPLS
def test_read_headers(benchmark, impl):
    """codec.read_headers on a consumed message (compare: test_confluent_kafka_headers)."""
    from tests.rdkafka_raw import message_with_headers
    mod = _impl(impl)
    msg = message_with_headers(RAW_HEADERS)
    assert benchmark(mod.read_headers, msg) == (INPUT_HEADERS, None)
    _record(benchmark, "read_headers", impl)


def test_confluent_kafka_headers(benchmark):
    """confluent-kafka's own Message.headers(), which read_headers replaces (a fresh message each round:
    it converts the list once)."""
    from tests.rdkafka_raw import message_with_headers

    def setup():
        return (message_with_headers(RAW_HEADERS),), {}

    assert benchmark.pedantic(lambda m: m.headers(), setup=setup, rounds=20000) == INPUT_HEADERS


# -- the store ------------------------------------------------------------------------------------

_ids = itertools.count()


def _rows(n: int, deadline_us: int) -> list[Row]:
    headers = codec.encode_headers(STORED_HEADERS[:2])
    return [Row(f"bench-{next(_ids)}", deadline_us, None, b"key-%d" % i, b"x" * 100, headers)
            for i in range(n)]


@pytest.fixture
def store(database_url):
    s = Store(database_url, node_id=uuid.uuid4())
    yield s
    s.close()


def _truncate(s: Store) -> None:
    s._c().execute("TRUNCATE chronos_messages")


def test_insert_batch(benchmark, store):
    """Store.insert of 2,000 rows: COPY into the staging table, then INSERT ... ON CONFLICT."""
    future = (time.time_ns() // 1000) + 3_600_000_000

    def setup():
        _truncate(store)
        return (_rows(BATCH, future),), {}

    inserted = benchmark.pedantic(store.insert, setup=setup, rounds=20, warmup_rounds=2)
    assert inserted == BATCH


def test_claim_batch(benchmark, store):
    """Store.claim of 2,000 due rows: one UPDATE ... RETURNING with FOR UPDATE SKIP LOCKED."""
    past = (time.time_ns() // 1000) - 1_000_000

    def setup():
        _truncate(store)
        store.insert(_rows(BATCH, past))
        return (BATCH, 300), {}

    claimed = benchmark.pedantic(store.claim, setup=setup, rounds=20, warmup_rounds=2)
    assert len(claimed) == BATCH


def test_delete_fired_batch(benchmark, store):
    """Store.delete_fired of 1,000 claimed rows (the firer's delete batch) after their publish."""
    past = (time.time_ns() // 1000) - 1_000_000

    def setup():
        _truncate(store)
        store.insert(_rows(1000, past))
        return (store.claim(1000, 300),), {}

    deleted = benchmark.pedantic(store.delete_fired, setup=setup, rounds=20, warmup_rounds=2)
    assert deleted == 1000


# -- the roles' batch paths, per message (docs/benchmarks/hot-path.md) ----------------------------

@pytest.fixture
def role_gc():
    """The garbage collector tuned as in a role's process, for one benchmark."""
    import gc

    from chronos.runtime.process import tune_gc
    before = gc.get_threshold()
    tune_gc()
    yield
    gc.set_threshold(*before)


def test_consumer_batch_path(benchmark, database_url, role_gc):
    """A poll of 2,000 consumed messages through sort_batch to the COPY into PostgreSQL (per message:
    the median / 2,000)."""
    from benchmarks.hot_path import consumer_pass, input_messages
    store = Store(database_url, node_id=uuid.uuid4(), hot_path=True)
    messages = input_messages()
    assert benchmark.pedantic(consumer_pass, args=(store, messages), rounds=20, warmup_rounds=2) == BATCH
    benchmark.extra_info["us_per_message"] = round(benchmark.stats.stats.median / BATCH * 1e6, 2)
    store.close()


def test_firer_batch_path(benchmark, role_gc):
    """A claim of 2,000 rows through the publishing thread (a produce() per row, its delivery report)
    to the settling thread's delete parameters (per message: the median / 2,000)."""
    from benchmarks.hot_path import claimed_rows, firer, firer_pass
    proc, rows = firer(), claimed_rows()
    assert benchmark.pedantic(firer_pass, args=(proc, rows), rounds=20, warmup_rounds=2) == BATCH
    benchmark.extra_info["us_per_message"] = round(benchmark.stats.stats.median / BATCH * 1e6, 2)

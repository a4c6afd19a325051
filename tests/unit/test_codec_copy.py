"""copy_rows, the consumer's rows as one PostgreSQL binary COPY stream, against both implementations
(that PostgreSQL reads it back as written: tests/contract, the store's inserts)."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronos.codec import COPY_COLUMNS, implementation
from chronos.domain.model import Row

NATIVE, PYTHON = implementation("native"), implementation("python")
PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01, where binary timestamptz counts from
PARTITION = COPY_COLUMNS.index("input_partition")


@pytest.fixture(params=["python", "native"])
def impl(request):
    return implementation(request.param)


def read_copy(data: bytes, columns: int = len(COPY_COLUMNS)) -> list[list[bytes | int | None]]:
    """An independent reader of PostgreSQL's binary COPY format (a field: int32 length, -1 NULL):
    each row's fields as bytes, the deadline as epoch microseconds."""
    assert data[:11] == b"PGCOPY\n\xff\r\n\x00" and data[11:19] == bytes(8)
    pos, rows = 19, []
    while True:
        (count,) = struct.unpack_from(">h", data, pos)
        pos += 2
        if count == -1:
            assert pos == len(data)
            return rows
        assert count == columns
        fields: list[bytes | int | None] = []
        for column in range(count):
            (size,) = struct.unpack_from(">i", data, pos)
            pos += 4
            if size == -1:
                fields.append(None)
                continue
            raw = data[pos:pos + size]
            pos += size
            fields.append(struct.unpack(">q", raw)[0] + PG_EPOCH_US if column == 1
                          else struct.unpack(">i", raw)[0] if column == PARTITION else raw)
        rows.append(fields)


ROWS = [
    Row("m-1", 1_800_000_000_000_000, None, b"key", b"value", b"\x00\x00\x00\x01h\x00\x00\x00\x00"),
    Row("été-✓", -62135596800000000, "other.topic", None, None, b"", "order-7", 0, "*/5 * * * *",
        "Europe/Paris", "skip"),
    Row("m-3", 0, None, b"", b"\x00\xff" * 1000, b"", None, 2**31 - 1, None, None, None),
]


def test_each_row_is_a_tuple_of_its_columns_in_copy_order(impl):
    rows = read_copy(impl.copy_rows(ROWS))
    assert rows[0] == [b"m-1", 1_800_000_000_000_000, None, b"key", b"value", ROWS[0].headers, None, None, None,
                       None, None]
    assert rows[1] == ["été-✓".encode(), -62135596800000000, b"other.topic", None, None, b"", b"order-7",
                       b"*/5 * * * *", b"Europe/Paris", b"skip", 0]
    assert rows[2][3:5] == [b"", b"\x00\xff" * 1000]  # an empty key is not NULL
    assert rows[2][PARTITION] == 2**31 - 1


def test_for_a_schema_before_the_input_partition_the_rows_leave_it_out(impl):
    rows = read_copy(impl.copy_rows(ROWS, input_partition=False), len(COPY_COLUMNS) - 1)
    assert rows[1] == ["été-✓".encode(), -62135596800000000, b"other.topic", None, None, b"", b"order-7",
                       b"*/5 * * * *", b"Europe/Paris", b"skip"]


def test_no_rows_is_a_stream_of_no_tuples(impl):
    assert read_copy(impl.copy_rows([])) == []
    assert impl.copy_rows(iter([])) == impl.copy_rows([])


@pytest.mark.parametrize("bad, message", [
    (Row(None, 0, None, None, None, b""), "row 1: id cannot be copied from None"),  # type: ignore[arg-type]
    (Row("x", None, None, None, None, b""), "row 1: deadline_us cannot be copied from None"),  # type: ignore[arg-type]
    (Row("x", "soon", None, None, None, b""), "row 1: deadline_us cannot be copied from str"),  # type: ignore[arg-type]
    (Row("x", 0, b"topic", None, None, b""), "row 1: topic cannot be copied from bytes"),  # type: ignore[arg-type]
    (Row("x", 0, None, "key", None, b""), "row 1: key cannot be copied from str"),  # type: ignore[arg-type]
    (Row("x", 0, None, None, None, b"", None, "3"), "row 1: input_partition cannot be copied from str"),  # type: ignore[arg-type]
    (Row("x", 0, None, None, None, b"", None, -1), "row 1: input_partition cannot be copied from int"),
    (Row("x", 0, None, None, None, b"", None, True), "row 1: input_partition cannot be copied from bool"),
])
def test_a_field_of_the_wrong_type_is_a_clear_type_error(impl, bad, message):
    with pytest.raises(TypeError) as raised:
        impl.copy_rows([ROWS[0], bad])
    assert str(raised.value) == message


text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
maybe_text, maybe_bytes = st.none() | text, st.none() | st.binary(max_size=40)
rows = st.builds(Row, text, st.integers(-62135596800000000, 253402300799999999), maybe_text, maybe_bytes,
                 maybe_bytes, st.binary(max_size=40), maybe_text, st.none() | st.integers(0, 2**31 - 1), maybe_text,
                 maybe_text, maybe_text)


@given(st.lists(rows, max_size=5), st.booleans())
def test_both_implementations_write_the_same_stream(batch, partition):
    assert NATIVE.copy_rows(batch, partition) == PYTHON.copy_rows(batch, partition)

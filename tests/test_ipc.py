"""Arrow IPC stream bytes: compressed from a size up, read back by any Arrow reader exactly."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest

from changelake.ipc import stream_bytes

pytestmark = pytest.mark.unit


def _table(rows: int, chunks: int = 1) -> pa.Table:
    part = pa.table({
        "id": pa.array(range(rows), pa.int64()),
        "name": pa.array([None if i % 7 == 0 else f"prodükt {i} " * 4 for i in range(rows)], pa.string()),
        "price": pa.array([decimal.Decimal(f"{i}.{i % 100:02d}") for i in range(rows)], pa.decimal128(38, 2)),
    })
    return pa.concat_tables([part] * chunks)


@pytest.mark.parametrize("rows, chunks", [(0, 1), (3, 1), (5_000, 1), (50, 200)])
def test_a_stream_reads_back_the_same_table_compressed_or_not(rows, chunks):
    table = _table(rows, chunks)
    for compress_from in (0, 1 << 40):
        back = pa.ipc.open_stream(stream_bytes(table, compress_from)).read_all()
        assert back.schema == table.schema and back.equals(table)


def test_only_a_table_of_the_threshold_or_more_is_compressed_and_then_in_one_batch():
    big, small = _table(5_000), _table(3)
    plain, packed = stream_bytes(big, 1 << 40), stream_bytes(big, big.nbytes)
    assert len(packed) * 2 < len(plain)
    assert stream_bytes(small, small.nbytes + 1) == stream_bytes(small, 1 << 40)
    many = _table(50, 200)          # 200 chunks: compressed as one batch, not 200 batches' buffers apart
    reader = pa.ipc.open_stream(stream_bytes(many, 0))
    assert [b.num_rows for b in reader] == [many.num_rows]

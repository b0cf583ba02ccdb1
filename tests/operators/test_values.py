"""Kernels keep SQL's semantics at the corners of the value domain (found by tests/spark/test_value_domain.py).

* a NaN equals every NaN and sorts above every number, also after a snapshot round trip, and keeps its
  bits (``_values``);
* SUM is exact: DECIMAL(38, s) does not round to Python's 28 digits, the vectorised fold does
  not wrap at 2^63, and a result its column cannot hold raises ValueOverflowError;
* the vectorised fold groups a BIGINT key column with a NULL by its values (pandas made it float64).
"""

from __future__ import annotations

import decimal
import math
import pickle
import struct

import pyarrow as pa
import pytest

from changelake.changelog import KIND
from changelake.errors import ValueOverflowError
from changelake.operators._rows import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE, Changes
from changelake.operators._state import decode_value, encode_value
from changelake.operators._topn_buffer import SortColumn, SortOrder
from changelake.operators._values import NAN, SqlNaN, canonical
from changelake.operators.deduplicate import Deduplicate, DeduplicateConfig
from changelake.operators.group_aggregate import AggCall, GroupAggregate, GroupAggregateConfig, local_partials
from changelake.operators.rank import RankConfig, make_rank
from changelake.operators.sink_upsert_materializer import SinkUpsertMaterializer, SinkUpsertMaterializerConfig

pytestmark = pytest.mark.unit

D = decimal.Decimal
ROWS = pa.schema([("k", pa.int64()), ("v", pa.float64())])


def arrow(records, schema=ROWS) -> pa.Table:
    return Changes.of(records).to_arrow(schema)


def restored(kernel, config):
    """``kernel`` after a snapshot -> bytes -> restore round trip (as between Spark micro-batches)."""
    return type(kernel).restore(config, kernel.snapshot())


def bits(v: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", v))[0]


ODD_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0123))[0]   # negative, with a payload


def test_the_kernels_nan_equals_any_nan_keeps_its_bits_and_survives_the_state_codec():
    assert NAN == float("nan") and float("nan") == NAN and not NAN != float("nan")
    assert NAN != 1.0 and not NAN == 1.0
    odd = canonical(ODD_NAN)
    assert isinstance(odd, SqlNaN) and odd == NAN and hash(odd) == hash(NAN) and bits(odd) == bits(ODD_NAN)
    again = decode_value(encode_value((1, odd)))
    assert again == (1, NAN) and hash(again) == hash((1, NAN)) and bits(again[1]) == bits(ODD_NAN)
    assert bits(pickle.loads(pickle.dumps(odd))) == bits(ODD_NAN)
    assert canonical(-0.0) == 0.0 and math.copysign(1, canonical(-0.0)) < 0
    assert bits(pa.array([odd], pa.float64())[0].as_py()) == bits(ODD_NAN)
    assert math.isnan(pa.array([NAN], pa.float32())[0].as_py())


def test_a_row_holding_nan_matches_its_retraction_after_restore():
    """The materializer (no upsert key) matches rows whole; before, a NaN row never matched its -D."""
    config = SinkUpsertMaterializerConfig(keys=(0,))
    op = SinkUpsertMaterializer(config)
    op.process(arrow([(INSERT, (1, float("nan"))), (INSERT, (1, 2.0))]))
    op = restored(op, config)
    out = op.process(arrow([(DELETE, (1, 2.0)), (DELETE, (1, float("nan")))]))
    assert [(k, r[0]) for k, r in out] == [(UPDATE_AFTER, 1), (DELETE, 1)]
    assert op.stale.count == 0 and op.state_rows == 0


def test_normalize_suppresses_a_redelivered_row_holding_nan():
    config = DeduplicateConfig(keys=(0,), keep="last", input_insert_only=False)
    op = Deduplicate(config)
    op.process(arrow([(INSERT, (1, float("nan")))]))
    assert op.process(arrow([(INSERT, (1, float("nan")))])).as_pairs() == []
    assert restored(op, config).process(arrow([(INSERT, (1, float("nan")))])).as_pairs() == []


def test_min_max_of_a_double_put_nan_above_infinity_and_retract_it():
    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("MAX", 1), AggCall("MIN", 1)))
    op = GroupAggregate(config)
    out = op.process(arrow([(INSERT, (1, math.inf)), (INSERT, (1, float("nan"))), (INSERT, (1, -1.0))]))
    last = out.rows[-1]
    assert math.isnan(last[1]) and last[2] == -1.0
    op = restored(op, config)
    out = op.process(arrow([(DELETE, (1, float("nan")))]))
    assert out.rows[-1] == (1, math.inf, -1.0)
    assert op.stale.count == 0


@pytest.mark.parametrize("descending", [True, False])
def test_top_n_orders_nan_above_every_number_and_retracts_it(descending):
    """Before, a NaN sort key crashed the Top-N (no rank found for the row it had just put)."""
    config = RankConfig(strategy="retract", partition_keys=(), sort_keys=(SortColumn(1, ascending=not descending),),
                        rank_end=2, output_rank_number=True)
    op = make_rank(config)
    op.process(arrow([(INSERT, (1, 5.0)), (INSERT, (2, float("nan"))), (INSERT, (3, math.inf)),
                      (INSERT, (4, -0.0))]))
    op = restored(op, config)
    op.process(arrow([(DELETE, (2, float("nan")))]))
    assert op.stale.count == 0
    buffer = [row for _, rows in op.state.get((), 0)["buffer"] for row in rows]
    assert [r[0] for r in buffer] == ([3, 1, 4] if descending else [4, 1, 3])


def test_sort_order_puts_nan_above_infinity_in_compare_and_key():
    order = SortOrder([SortColumn(0, ascending=True)])
    values = [(float("nan"),), (math.inf,), (-math.inf,), (0.0,), (None,)]
    assert [v[0] for v in sorted(values, key=order.key)][:3] == [-math.inf, 0.0, math.inf]
    assert math.isnan(sorted(values, key=order.key)[3][0])
    assert order.compare((float("nan"),), (math.inf,)) == 1 and order.compare((NAN,), (float("nan"),)) == 0


def test_sum_of_decimal_38_is_exact():
    """Python's default decimal context rounds to 28 digits; DECIMAL(38, 10) holds 38."""
    schema = pa.schema([("k", pa.int64()), ("v", pa.decimal128(38, 10))])
    big = D("123456789012345678901234567.8901234567")
    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("SUM", 1),))
    op = GroupAggregate(config)
    op.process(arrow([(INSERT, (1, big)), (INSERT, (1, D("0.0000000001")))], schema))
    out = restored(op, config).process(arrow([(DELETE, (1, D("0.0000000001")))], schema))
    assert out.rows[-1] == (1, big) and out.rows[-1][1].as_tuple() == big.as_tuple()
    partials, _ = local_partials(arrow([(INSERT, (1, big)), (INSERT, (1, big))], schema),
                                 GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("SUM", 1),)))
    assert partials == [[2, [[D("246913578024691357802469135.7802469134"), 2]]]]


BIG = pa.schema([("k", pa.int64()), ("v", pa.int64())])


def test_the_vectorised_fold_sums_bigint_exactly_past_2_63():
    """The two-phase local step folds each Arrow batch in NumPy; int64 sums wrapped around."""
    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("SUM", 1), AggCall("COUNT")),
                                  mini_batch_size=4)
    top = 2**63 - 1
    partials, _ = local_partials(arrow([(INSERT, (1, top)), (INSERT, (1, top)), (INSERT, (1, -2**63))], BIG),
                                 config)
    assert partials == [[3, [[top + top - 2**63, 3], 3]]]
    # the bundle's sum passes 2^63 on the way and comes back: the result is exact
    op = GroupAggregate(config)
    out = op.process(arrow([(INSERT, (1, top)), (INSERT, (2, 1)), (INSERT, (1, top)), (DELETE, (1, top))], BIG))
    assert out.as_pairs() == [("+I", (1, top, 1)), ("+I", (2, 1, 1))]


def test_the_vectorised_fold_keeps_bigint_keys_apart_next_to_a_null():
    """pandas made a BIGINT key column holding a NULL float64, where 2^63-1 and 2^63-2 are one value."""
    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("COUNT"),), mini_batch_size=4)
    keys = [2**63 - 1, None, 2**63 - 2, 2**63 - 1]
    out = GroupAggregate(config).process(arrow([(INSERT, (k, 0)) for k in keys], BIG))
    assert out.as_pairs() == [("+I", (2**63 - 1, 2)), ("+I", (None, 1)), ("+I", (2**63 - 2, 1))]
    partials, first = local_partials(arrow([(INSERT, (k, 0)) for k in keys], BIG), config)
    assert [p[0] for p in partials] == [2, 1, 1] and first == [0, 1, 2]


@pytest.mark.parametrize("mini_batch", [None, 2])
def test_a_sum_beyond_bigint_raises_value_overflow(mini_batch):
    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("SUM", 1),), mini_batch_size=mini_batch)
    op = GroupAggregate(config)
    out = op.process(arrow([(INSERT, (1, 2**62)), (INSERT, (1, 2**62))], BIG))
    out.extend(op.finish())
    with pytest.raises(ValueOverflowError, match="cannot hold 9223372036854775808"):
        out.to_arrow(BIG)


def test_a_bundle_whose_sum_passes_bigint_and_comes_back_emits_the_exact_sum():
    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("SUM", 1),), mini_batch_size=3)
    op = GroupAggregate(config)
    out = op.process(arrow([(INSERT, (1, 2**62)), (INSERT, (1, 2**62)), (UPDATE_BEFORE, (1, 2**62))], BIG))
    assert out.to_arrow(BIG).column("v").to_pylist() == [2**62]


def test_an_arrow_round_trip_keeps_every_changes_value_and_kind():
    rows = [(INSERT, (1, ODD_NAN)), (DELETE, (2, -0.0))]
    back = Changes.from_arrow(arrow(rows))
    assert back.kinds == [INSERT, DELETE] and isinstance(back.rows[0][1], SqlNaN)
    assert bits(back.to_arrow(ROWS).column("v")[0].as_py()) == bits(ODD_NAN)
    assert math.copysign(1, back.rows[1][1]) < 0
    assert KIND in arrow(rows).column_names


def test_the_vectorised_fold_groups_a_double_key_as_the_row_path_does():
    """Arrow's group_by tells -0.0 from 0.0 and NaNs by their bits; SQL, and the row path, do not."""
    schema = pa.schema([("k", pa.float64()), ("v", pa.int64())])
    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("COUNT"), AggCall("SUM", 1)),
                                  mini_batch_size=6)
    rows = arrow([(INSERT, (-0.0, 1)), (INSERT, (float("nan"), 2)), (INSERT, (0.0, 3)), (INSERT, (ODD_NAN, 4)),
                  (INSERT, (1.5, 5)), (INSERT, (None, 6))], schema)
    vectorised = GroupAggregate(config).process(rows).as_pairs()          # a full Arrow bundle: the fold
    row_path = GroupAggregate(config).process(Changes.from_arrow(rows)).as_pairs()
    assert [r[1:] for _, r in vectorised] == [r[1:] for _, r in row_path] == [(2, 4), (2, 6), (1, 5), (1, 6)]
    partials, first = local_partials(rows, config)
    assert [p[0] for p in partials] == [2, 2, 1, 1] and first == [0, 1, 4, 5]


def test_avg_of_a_decimal_rounds_half_up_to_the_input_scale():
    """It divided in Python's default context, and a quotient with more places than DECIMAL(38, s)
    failed to convert ("Rescaling Decimal value would cause data loss")."""
    schema = pa.schema([("k", pa.int64()), ("v", pa.decimal128(10, 2))])
    out_schema = pa.schema([("k", pa.int64()), ("a", pa.decimal128(38, 2))])
    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("AVG", 1),))
    out = GroupAggregate(config).process(arrow([(INSERT, (1, D("1.00"))), (INSERT, (1, D("1.00"))),
                                                (INSERT, (1, D("2.00"))), (INSERT, (2, D("-0.01"))),
                                                (INSERT, (2, D("-0.02")))], schema))
    last = {r[0]: r[1] for r in out.rows}
    assert last == {1: D("1.33"), 2: D("-0.02")}
    assert out.to_arrow(out_schema).num_rows == len(out)


def test_a_decimal_with_more_places_than_its_column_is_not_reported_as_an_overflow():
    with pytest.raises(pa.ArrowInvalid):
        Changes.of([(INSERT, (D("1.001"),))]).to_arrow(pa.schema([("v", pa.decimal128(38, 2))]))
    with pytest.raises(ValueOverflowError):
        Changes.of([(INSERT, (D("1E36"),))]).to_arrow(pa.schema([("v", pa.decimal128(38, 2))]))

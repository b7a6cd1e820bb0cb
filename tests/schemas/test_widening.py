"""The one type rule (schemas/widening.py): widen, never narrow; the input union uses it."""

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rescore.schemas import SchemaError, unify
from rescore.schemas.widening import cast, storable, widen, widen_schemas

L = pa.list_
CASES = [
    (pa.int64(), pa.float64(), pa.float64()),
    (pa.int32(), pa.int64(), pa.int64()),
    (pa.int8(), pa.float32(), pa.float32()),
    (pa.int32(), pa.float32(), pa.float64()),  # float32 does not hold every int32
    (pa.float32(), pa.float64(), pa.float64()),
    (pa.bool_(), pa.int8(), pa.int8()),
    (pa.bool_(), pa.uint8(), pa.uint8()),
    (pa.int8(), pa.uint8(), pa.int16()),
    (pa.int32(), pa.uint32(), pa.int64()),
    (pa.uint16(), pa.uint32(), pa.uint32()),
    (pa.uint64(), pa.int8(), pa.int64()),  # values checked when converted
    (L(pa.int32()), L(pa.int64()), L(pa.int64())),
    (L(pa.bool_()), L(pa.int8()), L(pa.int8())),
    (L(pa.int32()), pa.large_list(pa.int64()), pa.large_list(pa.int64())),
    (pa.string(), pa.large_string(), pa.large_string()),
    (pa.null(), pa.string(), pa.string()),
    (pa.dictionary(pa.int32(), pa.string()), pa.string(), pa.string()),
    (pa.timestamp("ms"), pa.timestamp("us"), pa.timestamp("us")),
    (pa.decimal128(5, 2), pa.decimal128(7, 0), pa.decimal128(9, 2)),
    (pa.struct([("a", pa.int32())]), pa.struct([("a", pa.float64()), ("b", pa.string())]),
     pa.struct([("a", pa.float64()), ("b", pa.string())])),
]
REFUSED = [
    (pa.int64(), pa.string()),
    (L(pa.int64()), pa.int64()),
    (L(pa.int64()), L(pa.string())),
    (pa.bool_(), pa.string()),
    (pa.timestamp("ms", "UTC"), pa.timestamp("ms")),
]


@pytest.mark.parametrize("a, b, want", CASES)
def test_widen_is_the_narrowest_lossless_type_either_way(a, b, want):
    assert widen(a, b) == want and widen(b, a) == want


@pytest.mark.parametrize("a, b", REFUSED)
def test_what_cannot_widen_is_refused(a, b):
    assert widen(a, b) is None and widen(b, a) is None


SCALARS = [pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
           pa.float32(), pa.float64()]
VALUES = {
    pa.bool_(): [True, False], pa.int8(): [-128, 127], pa.int16(): [-32768, 32767], pa.int32(): [-2**31, 2**31 - 1],
    pa.int64(): [-2**53, 2**53], pa.uint8(): [0, 255], pa.uint16(): [0, 65535], pa.uint32(): [0, 2**32 - 1],
    pa.float32(): [-1.5, 3.25], pa.float64(): [-23.58, 1e300],
}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SCALARS), st.sampled_from(SCALARS), st.booleans())
def test_widening_never_changes_a_value(a, b, as_list):
    """Every value of either type converts to the widened type and back unchanged (the
    extreme values of each type; int64 up to 2**53, where float64 is exact)."""
    t = widen(a, b)
    assert t is not None
    for src in (a, b):
        values = VALUES[src]
        arr = pa.array([values], L(src)) if as_list else pa.array(values, src)
        to = L(t) if as_list else t
        assert widen(arr.type, to) == to  # the widened type widens with nothing further
        got = cast(arr, to).to_pylist()
        want = [values] if as_list else values
        assert got == want, (src, t, got)


def test_a_union_of_schemas_names_the_column_and_both_sources():
    s1 = pa.schema([("task", pa.int64()), ("reward", pa.int64())])
    s2 = pa.schema([("task", pa.string()), ("reward", pa.float64())])
    with pytest.raises(ValueError) as e:
        widen_schemas([("day1.parquet", s1), ("day2.parquet", s2)])
    msg = str(e.value)
    assert "'task'" in msg and "day1.parquet" in msg and "day2.parquet" in msg and "int64" in msg and "string" in msg
    both = widen_schemas([("a", pa.schema([("reward", pa.int64())])), ("b", pa.schema([("reward", pa.float64()), ("x", pa.int8())]))])
    assert both.field("reward").type == pa.float64() and both.field("x").nullable


def test_unify_widens_masks_and_rewards_across_files():
    """Defect 11: a bool action_mask in one file, int8 and uint8 in others: one list<int16>."""
    base = [("batch", pa.int64()), ("task", pa.int64()), ("run", pa.int64())]
    schemas = [
        ("a", pa.schema([*base, ("reward", pa.int64()), ("action_mask", L(pa.bool_()))])),
        ("b", pa.schema([*base, ("reward", pa.float32()), ("action_mask", L(pa.int8()))])),
        ("c", pa.schema([*base, ("reward", pa.float64()), ("action_mask", L(pa.uint8()))])),
    ]
    s = unify(schemas)
    assert s.field("action_mask").type == L(pa.int16()) and s.field("reward").type == pa.float64()
    with pytest.raises(SchemaError, match="task"):
        unify([schemas[0], ("d", pa.schema([("batch", pa.int64()), ("task", pa.string()), ("run", pa.int64())]))])


def test_storable_types_hold_every_value_in_delta_types():
    """Delta Lake has no unsigned integers: delta-rs would store uint8 as int8 (200 -> -56)."""
    assert storable(pa.uint8()) == pa.int16() and storable(pa.uint32()) == pa.int64()
    assert storable(L(pa.uint16())) == L(pa.int32()) and storable(pa.large_string()) == pa.string()
    assert cast(pa.array([200], pa.uint8()), storable(pa.uint8())).to_pylist() == [200]
    with pytest.raises(pa.ArrowInvalid):  # checked: a uint64 beyond int64 never wraps
        cast(pa.array([2**64 - 1], pa.uint64()), storable(pa.uint64()))
    with pytest.raises(pa.ArrowInvalid):
        cast(pa.array([2**63], pa.uint64()), widen(pa.uint64(), pa.int64()))

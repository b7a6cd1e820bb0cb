"""The one rule for columns whose type differs between files, or between the input and the
incremental table: widen, never narrow.

Every place where two types of one column meet uses `widen` (the input union across files,
`schemas/experience.py: unify`; the incremental table against a run's rows,
`transforms/files/delta_table.py`), and every place that converts values to the widened type uses
`cast` (`transforms/input_plan.py: conform`, the rows an incremental run commits).

`widen(a, b)` is the narrowest type both convert to without losing a value, or None where there
is none (the change is refused, before any work):

- equal types, and null with anything: that type;
- bool with an integer: the integer (True is 1); bool with a float: the float;
- integers: the wider of the two; signed with unsigned: the signed type wider than both
  (int8 + uint8 -> int16, int32 + uint32 -> int64); uint64 with a signed integer: int64, each
  value checked when it is converted (a uint64 beyond int64 fails loudly, never wraps; for ids
  and rewards the plan checks it from the footers before any work);
- integer with float: float64, or float32 where every value of the integer fits it exactly
  (8- and 16-bit integers); two floats: the wider. An integer beyond 2**53 widened to float64
  is rounded, as int -> float always is (rewards are scored as float64 anyway);
- string, large_string (and binary, large_binary): the large one where one is large;
- lists (list, large_list, fixed-size list): a list of the widened value types (large where
  one is large): list<int32> + list<int64> -> list<int64>, list<bool> + list<uint8> ->
  list<uint8>;
- structs: the union of their fields, each widened; timestamps of one time zone: the finer
  unit; date32 + date64: date64; decimals: the precision and scale that hold both;
- dictionary-encoded columns: as their value type;
- anything else (int + string, a list + a scalar, bool + string): none.

Nothing here imports Beam or deltalake.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from rescore.errors import SchemaError

__all__ = ["widen", "widen_schemas", "cast", "cast_table", "describe", "storable", "storable_schema"]

_SIGNED = {8: pa.int8(), 16: pa.int16(), 32: pa.int32(), 64: pa.int64()}
_UNSIGNED = {8: pa.uint8(), 16: pa.uint16(), 32: pa.uint32(), 64: pa.uint64()}
_FLOATS = {16: pa.float16(), 32: pa.float32(), 64: pa.float64()}
_UNITS = ("s", "ms", "us", "ns")


def _is_list(t: pa.DataType) -> bool:
    return pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t)


def _int(t: pa.DataType) -> pa.DataType | None:
    return t if pat.is_integer(t) else None


def _widen_ints(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    sa, sb = pat.is_signed_integer(a), pat.is_signed_integer(b)
    if sa == sb:
        return a if a.bit_width >= b.bit_width else b
    signed, unsigned = (a, b) if sa else (b, a)
    return _SIGNED[min(64, max(signed.bit_width, unsigned.bit_width * 2))]  # uint64: int64, checked


def _widen_scalar(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    if pat.is_boolean(a) and (pat.is_integer(b) or pat.is_floating(b)):
        return b
    if pat.is_boolean(b) and (pat.is_integer(a) or pat.is_floating(a)):
        return a
    if pat.is_integer(a) and pat.is_integer(b):
        return _widen_ints(a, b)
    if pat.is_floating(a) and pat.is_floating(b):
        return a if a.bit_width >= b.bit_width else b
    if pat.is_integer(a) and pat.is_floating(b) or pat.is_floating(a) and pat.is_integer(b):
        i, f = (a, b) if pat.is_integer(a) else (b, a)
        if f.bit_width <= 32 and i.bit_width <= 16:
            return pa.float32()
        return pa.float64()
    if (pat.is_string(a) or pat.is_large_string(a)) and (pat.is_string(b) or pat.is_large_string(b)):
        return pa.large_string() if pat.is_large_string(a) or pat.is_large_string(b) else pa.string()
    if (pat.is_binary(a) or pat.is_large_binary(a)) and (pat.is_binary(b) or pat.is_large_binary(b)):
        return pa.large_binary() if pat.is_large_binary(a) or pat.is_large_binary(b) else pa.binary()
    if pat.is_timestamp(a) and pat.is_timestamp(b) and a.tz == b.tz:
        return pa.timestamp(max(a.unit, b.unit, key=_UNITS.index), a.tz)
    if pat.is_date(a) and pat.is_date(b):
        return pa.date64() if pat.is_date64(a) or pat.is_date64(b) else pa.date32()
    if pat.is_decimal(a) and pat.is_decimal(b):
        scale = max(a.scale, b.scale)
        digits = max(a.precision - a.scale, b.precision - b.scale) + scale
        if digits <= 38:
            return pa.decimal128(digits, scale)
        return pa.decimal256(digits, scale) if digits <= 76 else None
    return None


def widen(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The narrowest type both `a` and `b` convert to without losing a value; None if none."""
    if pat.is_dictionary(a):
        a = a.value_type
    if pat.is_dictionary(b):
        b = b.value_type
    if a == b:
        return a
    if pat.is_null(a):
        return b
    if pat.is_null(b):
        return a
    if _is_list(a) and _is_list(b):
        value = widen(a.value_type, b.value_type)
        if value is None:
            return None
        field = pa.field(a.value_field.name, value, nullable=a.value_field.nullable or b.value_field.nullable)
        return pa.large_list(field) if pat.is_large_list(a) or pat.is_large_list(b) else pa.list_(field)
    if pat.is_struct(a) and pat.is_struct(b):
        fields = {f.name: f for f in a}
        for f in b:
            if f.name in fields:
                t = widen(fields[f.name].type, f.type)
                if t is None:
                    return None
                fields[f.name] = pa.field(f.name, t)
            else:
                fields[f.name] = f
        return pa.struct([f.with_nullable(True) for f in fields.values()])
    if _is_list(a) or _is_list(b) or pat.is_struct(a) or pat.is_struct(b) or pat.is_map(a) or pat.is_map(b):
        return None
    return _widen_scalar(a, b)


def describe(t: pa.DataType) -> str:
    return str(t).replace("<item: ", "<").replace("<element: ", "<")


def widen_schemas(schemas: list[tuple[str, pa.Schema]]) -> pa.Schema:
    """One schema for several: every column of any of them (in order of first appearance,
    nullable where a schema lacks it or any field is nullable), its type widened across them.
    Raises SchemaError naming the column, the two types and the two sources (the first element of
    each pair: a file's path, or a table's description)."""
    fields: dict[str, pa.Field] = {}
    where: dict[str, str] = {}
    metadata = None
    for source, schema in schemas:
        if metadata is None and schema.metadata:
            metadata = schema.metadata
        for f in schema:
            if f.name not in fields:
                fields[f.name] = f
                where[f.name] = source
                continue
            have = fields[f.name]
            t = widen(have.type, f.type)
            if t is None:
                raise SchemaError(
                    f"column {f.name!r} is {describe(f.type)} in {source} but {describe(have.type)} in {where[f.name]}, "
                    "and neither widens to the other"
                )
            fields[f.name] = pa.field(f.name, t, nullable=have.nullable or f.nullable)
    n = len(schemas)
    for name in fields:
        if sum(name in s.names for _, s in schemas) < n:
            fields[name] = fields[name].with_nullable(True)
    return pa.schema(list(fields.values()), metadata=metadata)


def cast(column: pa.Array | pa.ChunkedArray, to: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """`column` converted to `to`, a type `widen` gave for it: checked (a value that does not
    fit raises), except integer -> float, which rounds beyond 2**53 (the meaning of that
    widening), and bool -> number (True is 1)."""
    if column.type == to:
        return column
    if _needs_unchecked(column.type, to):
        return pc.cast(column, to, safe=False)
    return pc.cast(column, to)


def _needs_unchecked(frm: pa.DataType, to: pa.DataType) -> bool:
    if pat.is_dictionary(frm):
        frm = frm.value_type
    if _is_list(frm) and _is_list(to):
        return _needs_unchecked(frm.value_type, to.value_type)
    if pat.is_struct(frm) and pat.is_struct(to):
        return any(_needs_unchecked(f.type, to.field(f.name).type) for f in frm if to.get_field_index(f.name) >= 0)
    return pat.is_integer(frm) and pat.is_floating(to)


def cast_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns in its order: missing ones null, the others
    converted with `cast`."""
    if table.schema.equals(schema, check_metadata=False):
        return table
    arrays = []
    for field in schema:
        if field.name in table.column_names:
            arrays.append(cast(table[field.name], field.type))
        else:
            arrays.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def storable(t: pa.DataType) -> pa.DataType:
    """The type a Delta Lake table stores a column of type `t` as, widened where Delta has no
    such type: unsigned integers as the signed type wider than them (uint64 as int64, checked
    value by value when the rows are converted), float16 as float32, large strings, binaries
    and lists as plain ones, dictionaries as their values. (delta-rs would otherwise store
    uint8 as int8.)"""
    if pat.is_dictionary(t):
        t = t.value_type
    if pat.is_unsigned_integer(t):
        return _SIGNED[min(64, t.bit_width * 2)]
    if pat.is_float16(t):
        return pa.float32()
    if pat.is_large_string(t) or pat.is_string_view(t):
        return pa.string()
    if pat.is_large_binary(t) or pat.is_binary_view(t):
        return pa.binary()
    if _is_list(t):
        return pa.list_(t.value_field.with_type(storable(t.value_type)))
    if pat.is_struct(t):
        return pa.struct([f.with_type(storable(f.type)) for f in t])
    return t


def storable_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, storable(f.type)) for f in schema])

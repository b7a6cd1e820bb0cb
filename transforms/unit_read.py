"""Reading a read unit: its rows decoded from the file (in batches, or from the column
decoders of a sliced row group), with the fingerprint checks every read makes, the model
stage's side columns joined, and conformed to the run's schema.

File I/O without Beam (pipelines/early.py decodes the first units with it before Beam is
imported). The units themselves are planned in transforms/input_plan.py; what is kept between
the two reads of a unit is transforms/unit_store.py.
"""

from __future__ import annotations

import pyarrow as pa

from rescore.transforms.files import fingerprint as fingerprints
from rescore.transforms.files import storage
from rescore.transforms.files.row_group_slices import SliceDecoders
from rescore.transforms.input_plan import ReadUnit
from rescore.errors import first_line
from rescore.transforms.rows.model_columns import join_model_columns


def read_unit(
    unit: ReadUnit, columns: list[str] | None = None, *, use_threads: bool = True, slices: SliceDecoders | None = None,
    joined: bool = True,
) -> pa.Table:
    """The unit's rows in file order (columns=None: all of them).

    joined=False: each column as the chunks it was decoded in, not joined into one (`_decode`):
    the same values, for a read whose table is looked at and dropped (the read step where the
    write step runs in another process), not kept for the output writer.

    A unit that is a slice of a larger row group is read with the column decoders of `slices`
    (the run's, transforms/unit_store.py: slices read in order decode each row once);
    without it, with decoders of this read alone (it decodes the rows before the slice too).

    A file whose footer read fine but whose data pages do not decode fails with a message
    naming the file and row groups (the plan cannot see that without reading every page).
    """
    if unit.fingerprint is not None:
        fingerprints.verify(unit.path, unit.fingerprint)
    try:
        pf = storage.open_parquet(unit.path)
        if columns is not None:
            present = set(pf.schema_arrow.names)
            columns = [c for c in columns if c in present]
        if unit.rows is None:
            table = _decode(pf, list(unit.row_groups), columns, use_threads, joined)
        else:
            table = _decode_slice(pf, unit, pf.schema_arrow.names if columns is None else columns, slices or SliceDecoders())
    except OSError as e:
        raise OSError(f"{unit.path}: cannot read {unit.where()}: {first_line(e)}") from e
    except (pa.ArrowException, ValueError) as e:
        raise ValueError(f"{unit.path}: corrupt data in {unit.where()}: {first_line(e)}") from e
    if unit.fingerprint is not None:  # a write during the read shows in stat()
        fingerprints.same_stat(unit.path, unit.fingerprint)
    if table.num_rows != unit.num_rows:
        raise ValueError(f"{unit.path}: {unit.where()} hold {table.num_rows} rows, the footer says {unit.num_rows}")
    if unit.model_file is not None:
        table = join_model_columns(table, storage.open_parquet(unit.model_file).read())
    return table


READ_BATCH_VALUES = 1 << 20
"""Values (list elements) per column per decoded batch of a read unit."""


def _batch_rows(pf, row_groups: list[int], columns: list[str] | None) -> int:
    """Rows per decoded batch: about READ_BATCH_VALUES values in the widest column read (64 to
    65,536 rows), from the footer's value counts."""
    meta = pf.metadata
    owner = [field.name for field in pf.schema_arrow for _ in range(_leaves(field.type))]  # leaf -> column
    per_row = 1.0
    for g in row_groups:
        group = meta.row_group(g)
        if group.num_rows == 0 or group.num_columns != len(owner):
            continue
        for k in range(group.num_columns):
            if columns is None or owner[k] in columns:
                per_row = max(per_row, group.column(k).num_values / group.num_rows)
    return int(min(1 << 16, max(64, READ_BATCH_VALUES // per_row)))


def _leaves(t: pa.DataType) -> int:
    """Parquet leaf columns of an Arrow type (a column's leaves are consecutive in the footer)."""
    if pa.types.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _leaves(t.key_type) + _leaves(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _leaves(t.value_type)
    return 1


def _decode(pf, row_groups: list[int], columns: list[str] | None, use_threads: bool, joined: bool = True) -> pa.Table:
    """The row groups' rows: the same table as `read_row_groups` (values, types, schema
    metadata, one chunk per column), decoded in batches of about READ_BATCH_VALUES values.

    Parquet's list reader reserves room for one value per row and grows its value and level
    buffers by reallocation as it decodes: reading a whole unit at once copied each token column
    about once more, into fresh pages each time (204,800 rows of 256 tokens: ~630k page faults,
    1.2 s of kernel time for the reads). Batches grow small buffers that the allocator hands
    back to the next batch, and one exact-size copy joins them: ~300k faults, ~0.6 s
    (benchmarks/README.md, issue 18). The joined columns let the output writer take them
    without a copy of its own.

    Columns are decoded and joined one at a time, each column's batches dropped as soon as it is
    joined: a unit then holds its batches and its joined copy of one column at once, not of
    every column (decoding every column's batches first and joining them after held a whole
    unit of batches: ~100 MB more at 204,800 benchmark rows, and 5-10 % slower, benchmarks/README.md
    issue 42), and the freed batches of a column are reused by the allocator for the next
    column's. Each column is read from its own column chunks, so nothing is decoded twice.

    joined=False skips the join (the table's columns are the batches' chunks): the join is the
    largest part of a read unit's decode in a Beam SDK worker on Flink (benchmarks/README.md,
    "Flink against in-process"), and only a table kept for the output writer needs it.
    """
    batch_rows = _batch_rows(pf, row_groups, columns)
    names = pf.schema_arrow.names if columns is None else list(columns)
    if not joined or not names or len(set(names)) != len(names):  # (a name twice: read as the file gives it)
        batches = list(pf.iter_batches(batch_size=batch_rows, row_groups=row_groups, columns=columns, use_threads=use_threads))
        if not batches:  # no rows: the schema as the file gives it
            return pf.read_row_groups(row_groups, columns=columns, use_threads=use_threads)
        table = pa.Table.from_batches(batches)
        return table if not joined else table.combine_chunks()
    fields, arrays, metadata = [], [], None
    for name in names:
        chunks = []
        # Each column in batches of about READ_BATCH_VALUES of its own values (a scalar column in
        # one batch per unit of up to 65,536 rows): ~50 batches per benchmark unit, not ~120.
        rows = _batch_rows(pf, row_groups, [name])
        for batch in pf.iter_batches(batch_size=rows, row_groups=row_groups, columns=[name], use_threads=use_threads):
            if not chunks:  # the column's field and the schema's metadata, as the batches give them
                fields.append(batch.schema.field(0))
                metadata = batch.schema.metadata
            chunks.append(batch.column(0))
        if not chunks:  # no rows: the schema as the file gives it
            return pf.read_row_groups(row_groups, columns=columns, use_threads=use_threads)
        arrays.append(chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks))
        del chunks
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))


def _decode_slice(pf, unit: ReadUnit, columns: list[str], slices: SliceDecoders) -> pa.Table:
    """Rows unit.rows of the unit's row group, each column from its decoder in `slices`
    (transforms/files/row_group_slices.py): the same table as `_decode` of the whole row group,
    sliced."""
    group = unit.row_groups[0]

    def open_column(name: str):
        # A reader of its own (decoders run on several threads) that reads the column chunk as
        # it decodes it: pre-buffered, a large row group's chunk would be held for all its slices.
        own = storage.open_parquet(unit.path, streaming=True)
        return own.iter_batches(batch_size=_batch_rows(own, [group], [name]), row_groups=[group], columns=[name], use_threads=False)

    key = (unit.path, unit.fingerprint, group)
    return slices.read(key, pf.metadata.row_group(group).num_rows, *unit.rows, columns, open_column)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns: missing ones null, narrower types widened
    (`schemas/widening.py`: the one rule, the one conversion)."""
    from rescore.schemas.widening import cast_table

    return cast_table(table, schema)

"""A Beam coder that moves Arrow tables as Arrow IPC streams.

The default pickle coder would serialise a zero-copy slice together with its whole parent
buffer (Arrow GH-26685); the IPC writer writes only the slice's own range.
"""

from __future__ import annotations

import pyarrow as pa
from apache_beam import coders


class ArrowTableCoder(coders.Coder):
    def encode(self, table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    def decode(self, encoded: bytes) -> pa.Table:
        return pa.ipc.open_stream(pa.py_buffer(encoded)).read_all()

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self):
        return pa.Table


coders.registry.register_coder(pa.Table, ArrowTableCoder)

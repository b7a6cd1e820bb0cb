"""The Arrow IPC coder moves only a slice's own rows, and the shuffle uses it."""

import numpy as np
import pyarrow as pa

from rescore.transforms.coders import ArrowTableCoder


def test_slice_encodes_without_its_parent_buffer():
    parent = pa.table({"x": np.arange(1_000_000, dtype=np.int64)})
    part = parent.slice(10, 100)
    coder = ArrowTableCoder()
    encoded = coder.encode(part)
    assert len(encoded) < 10_000
    assert coder.decode(encoded).equals(part)

"""Input fingerprints (transforms/files/fingerprint.py): a rewrite that keeps size and mtime is
still caught."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


def test_a_rewrite_that_keeps_size_and_mtime_is_caught_by_ctime(tmp_path):
    from rescore.transforms.files.fingerprint import InputChanged, take, verify

    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"reward": [0.0, 1.0]}), path)
    planned = take(path)
    st = os.stat(path)
    pq.write_table(pa.table({"reward": [1.0, 0.0]}), path)  # same size and footer
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back
    assert os.path.getsize(path) == st.st_size
    with pytest.raises(InputChanged, match="changed while the run was reading it"):
        verify(path, planned)

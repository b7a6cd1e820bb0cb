"""The I/O floor: read the table and write it back with one added list column, no math.

    python benchmarks/io_floor.py IN.parquet OUT.parquet
"""

import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

table = pq.read_table(sys.argv[1])
mask = table["action_mask"].combine_chunks()
zeros = pa.ListArray.from_arrays(mask.offsets, pa.array(np.zeros(len(mask.flatten()), dtype=np.float32)))
pq.write_table(table.append_column("advantages", zeros), sys.argv[2])

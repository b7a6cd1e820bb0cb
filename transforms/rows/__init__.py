"""The row work: Arrow and numpy over experience rows, no Beam (tests/rows/test_rows_no_beam.py).

keys: light rows, task hashes, shuffle buckets; hashing: the one splitmix64; groups: sorting,
duplicate ids, group offsets, GroupedRows for the math; copies: duplication, from copy plans to
copied rows; outcomes: scored / filtered / rejected per row; output_rows: the rows a read unit
writes; tokens: token columns and part splitting; metrics; audit. The Beam shells in
rescore.transforms call these.
"""

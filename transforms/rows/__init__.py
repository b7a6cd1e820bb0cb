"""The row work: Arrow and numpy over experience rows, no Beam (tests/rows/test_rows_no_beam.py).

keys: light rows, task hashes, shuffle buckets; groups: sorting, duplicate ids, group offsets,
GroupedRows for the math; copies: duplication, from copy plans to copied rows; outcomes:
scored / filtered / rejected per row; output_rows: the rows a read unit writes; tokens: token
columns and part splitting; strategy_columns: what strategies read from and add to written
rows; metrics; audit; model_columns: how a model stage's side file joins a unit's rows;
trinity_format: Trinity-RFT's TRXP experience blobs; tensors: host arrays to tensors on the
math's device. The Beam shells in rescore.transforms call these.
"""

"""The row work: Arrow and numpy over experience rows, no Beam.

keys (light rows, task hashing, shuffle buckets, splitmix64), groups (sorting, duplicate ids,
group offsets), copies (duplication: copy plans and copy expansion), tokens (token columns,
part splitting), outcomes (scored / filtered / rejected per row), metrics, audit. The Beam
shells in rescore.transforms call these; nothing here imports apache_beam.
"""

"""The files Rescore reads and writes: storage access (local and Beam FileSystems schemes), the
output lock, what Rescore owns in an output and how a run publishes, input fingerprints, how a
scored file is encoded (`parquet_out`), the decoded read units kept for the second read
(`unit_cache`), and the output layout's names (`layout`)."""

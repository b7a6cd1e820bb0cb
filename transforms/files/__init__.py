"""The output directory and the files Rescore reads and writes: storage access (local and Beam
FileSystems schemes), the output lock, what Rescore owns in an output and how a run publishes,
input fingerprints, and the output layout's names (`layout`)."""

"""splitmix64: the one fixed, platform-independent 64-bit hash of the job (numpy only).

Every hash Rescore derives from data keys goes through `mix64`: task hashes and shuffle buckets
(rows/keys.py), the copy plan's order (rows/copies.py) and the per-row draws of seeded
estimators (strategies/estimators.py: row_keys). It lives with the math so that the math needs
no Arrow; the row layer imports it from here. Unlike Python's hash(), it is the same in every
process and on every platform.

`string_key` is the int64 a string value crosses the shuffle as (rows/keys.py task_hash:
splitmix64 of its CRC-32).
"""

from __future__ import annotations

import zlib

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
"""2^64 / golden ratio: the increment splitmix64 adds between draws."""
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def mix64(x) -> np.ndarray:
    """splitmix64 finaliser over uint64 values (wrapping arithmetic); a fresh array (or 0-d
    array for a scalar), the input untouched."""
    x = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _MIX1
        x ^= x >> np.uint64(27)
        x *= _MIX2
        x ^= x >> np.uint64(31)
    return x


def string_key(text: str) -> int:
    """The int64 hash of one string value, as the row layer hashes string columns."""
    return int(mix64(np.uint64(zlib.crc32(text.encode("utf-8")))).view(np.int64))

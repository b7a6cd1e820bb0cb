"""Fixed 64-bit hashes for randomness seeded from data keys (numpy only, the same in every
process and on every platform, unlike Python's hash()).

`mix64` is the splitmix64 finaliser; `string_key` is the int64 a string value crosses the
shuffle as (transforms/light.py task_hash: splitmix64 of its CRC-32).
"""

from __future__ import annotations

import zlib

import numpy as np


def mix64(x) -> np.ndarray:
    """splitmix64 finaliser over uint64 values (wrapping arithmetic, platform independent)."""
    x = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def string_key(text: str) -> int:
    """The int64 hash of one string value, as the row layer hashes string columns."""
    return int(mix64(np.uint64(zlib.crc32(text.encode("utf-8")))).view(np.int64))

"""splitmix64: the one fixed, platform-independent 64-bit hash of the job (numpy only).

Every hash Rescore derives from data keys goes through `mix64`: task hashes and shuffle buckets
(rows/keys.py), the copy plan's order (rows/copies.py) and the per-row draws of seeded
estimators (strategies/estimators.py: row_keys). It lives with the math so that the math needs
no Arrow; the row layer imports it from here. Unlike Python's hash(), it is the same in every
process and on every platform.

`string_key` is the int64 a string value is keyed by: splitmix64 of the first 8 bytes of its
BLAKE2b digest (never a 32-bit CRC: ~77k distinct ids give even odds of a CRC-32 collision, and
real pairs such as 'buckeroo' / 'plumless' exist). A key may choose a bucket or a seed; it never
decides that two values are the same: `exact_codes` gives the int64 codes a string column
crosses into the math as, equal exactly where the strings are equal.
"""

from __future__ import annotations

import hashlib

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
    """The int64 key of one string value (`exact_codes` makes it exact within a set of values)."""
    return int(mix64(np.uint64(_digest64(text))).view(np.int64))


def _digest64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def string_keys(values: list[str]) -> np.ndarray:
    """(n,) uint64: string_key of each value, as unsigned."""
    return mix64(np.array([_digest64(v) for v in values], dtype=np.uint64))


RESPONSE_TRUNCATED = "response_truncated"
COMPARED_STRINGS = (RESPONSE_TRUNCATED,)
"""The string values a strategy compares a column's codes with (string_key(value)); a code is
equal to one of their keys only where the value is that string (`exact_codes`)."""


def exact_codes(values: list[str]) -> np.ndarray:
    """(n,) int64 codes of distinct string `values`: string_key(v), except where two different
    strings share a key, or a string shares the key of one of COMPARED_STRINGS: then the later
    one (in sorted order) takes the key of v + NUL * k for the smallest k that is free. Equal
    codes <=> equal strings, and 0 (a null's code) is never one; the same set of values gives
    the same codes in every process."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    taken = {string_key(c): c for c in COMPARED_STRINGS}
    taken[0] = None
    out = np.zeros(len(values), dtype=np.int64)
    for i in order:
        v = values[i]
        suffix = 0
        key = string_key(v)
        while key in taken and taken[key] != v:
            suffix += 1
            key = string_key(v + "\0" * suffix)
        taken[key] = v
        out[i] = key
    return out

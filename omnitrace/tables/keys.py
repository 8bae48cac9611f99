"""The one key packer of the tables: several small integer columns as one int64 that sorts
as the tuple does (``pack``), back again (``unpack``), and dense ids over distinct keys
(``dense``). Every composite key the tables make (a stage visit's request, stage and
replica; a sender's pid and stage) goes through it: its field widths are checked, never
assumed."""
from __future__ import annotations

from typing import Sequence

import numpy as np


class KeyOverflow(ValueError):
    """A value does not fit its field's width."""


def pack(fields: Sequence[tuple[np.ndarray, int]]) -> np.ndarray:
    """``fields``: (values, bits) each, first the most significant; values may be negative
    (a field of ``bits`` holds [-2^(bits-1), 2^(bits-1))). The key orders rows as the
    tuple of their values does. At most 63 bits in all."""
    if sum(b for _, b in fields) > 63:
        raise KeyOverflow(f"fields of {sum(b for _, b in fields)} bits do not fit an int64 key")
    key: np.ndarray | int = 0
    for values, bits in fields:
        v = np.asarray(values).astype(np.int64) + (1 << (bits - 1))
        if len(v) and (int(v.min()) < 0 or int(v.max()) >= 1 << bits):
            raise KeyOverflow(f"a value outside the {bits}-bit field of a key")
        key = (key << bits) | v
    return np.asarray(key, np.int64)


def unpack(key: np.ndarray, bits: Sequence[int]) -> list[np.ndarray]:
    """The fields :func:`pack` made ``key`` of, with these ``bits``, in order."""
    out, shift = [], sum(bits)
    for b in bits:
        shift -= b
        out.append(((key >> shift) & ((1 << b) - 1)) - (1 << (b - 1)))
    return out


def dense(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct keys, sorted; each row's index into them): ids 0..n-1 in key order."""
    uniq, inv = np.unique(key, return_inverse=True)
    return uniq, inv.astype(np.int64)

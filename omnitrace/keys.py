"""The one key packer: several small integer columns as one int64 that sorts as the tuple
does (``pack``), back again (``unpack``), dense ids over distinct keys (``dense``), and
rows grouped by key (``groups``). Every composite key the tables make (a stage visit's
request, stage and replica) and every FIFO sender's (``sender_key``: the span builder's,
the report's, the flame graphs', the tables') goes through it: its field widths are
checked, never assumed."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

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


def lookup(sorted_keys: np.ndarray, key: np.ndarray, values: np.ndarray, missing: int) -> np.ndarray:
    """The value of each ``key`` (``values[i]`` is ``sorted_keys[i]``'s), ``missing`` for a
    key not among them."""
    if not len(sorted_keys):
        return np.full(len(key), missing, values.dtype)
    pos = np.minimum(np.searchsorted(sorted_keys, key), len(sorted_keys) - 1)
    return np.where(sorted_keys[pos] == key, values[pos], missing)


def dense(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct keys, sorted; each row's index into them): ids 0..n-1 in key order."""
    uniq, inv = np.unique(key, return_inverse=True)
    return uniq, inv.astype(np.int64)


# A request's visit of a stage (its stage and queue spans), on one replica or any.
VISIT_BITS = (32, 15, 15)  # request, stage, replica
REQUEST_STAGE_BITS = (32, 16)  # request, stage (or replica)


def visit_key(req: np.ndarray, stage: np.ndarray, replica: np.ndarray) -> np.ndarray:
    return pack(list(zip((req, stage, replica), VISIT_BITS)))


def request_stage_key(req: np.ndarray, stage: np.ndarray) -> np.ndarray:
    return pack(list(zip((req, stage), REQUEST_STAGE_BITS)))


# A FIFO's sender: the thread that takes its chunks off one at a time
# (``spantable.sender_tasks``), named by where it runs -- a process id in the span builder,
# a replica in the report (one timeline for a replica's processes and run directories) --
# and its stage.
SENDER_BITS = (32, 16)  # where, stage


def sender_key(where: np.ndarray, stage: np.ndarray) -> np.ndarray:
    return pack(list(zip((where, stage), SENDER_BITS)))


def sender_of(key: int) -> tuple[int, int]:
    """(where, stage) of one :func:`sender_key`."""
    where, stage = unpack(np.int64(key), SENDER_BITS)
    return int(where), int(stage)


def groups(key: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(key, the indices of its rows, ascending) for each distinct ``key``, in key order."""
    order = np.argsort(key, kind="stable")
    in_order = key[order]
    heads = np.flatnonzero(np.r_[len(key) > 0, in_order[1:] != in_order[:-1]])
    for lo, hi in zip(heads.tolist(), np.append(heads[1:], len(key)).tolist()):
        yield int(in_order[lo]), order[lo:hi]

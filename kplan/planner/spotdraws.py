"""Counter-based random numbers for the spot Monte-Carlo (``spotsim.simulate``).

Every number a lane draws is a hash of (its configuration's key, its run index, its event
counter, a draw slot): the splitmix64 finaliser applied in turn to each field, in numpy
``uint64`` (wrapping arithmetic). So a configuration's runs draw the same numbers whatever
other configurations are simulated with it, and in whatever order; ``seed`` enters the key and
changes every stream. A configuration's key is a hash of what defines it (``row_keys``: its
work, nodes, risk, policy, prices, billing), not its position in the batch.

Uniforms are the top 53 bits of the hash, shifted half a step off 0, in (0, 1); exponentials
``-log(u)``; normals Box-Muller from two uniforms of their own slots.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

U64 = NDArray[np.uint64]
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))
_STEP = 2.0**-53

# draw slots: a purpose times SLOT_SPAN plus a node rank (< SLOT_SPAN)
SLOT_SPAN = 1 << 20
WORK_Z1, WORK_Z2 = 1, 2  # the run's work (normal)
REGIME_Z1, REGIME_Z2, REGIME_Z3, REGIME_Z4 = 3, 4, 5, 6  # its market period (two normals)
CAP_OUT, CAP_REGION, CAP_DUR = 7, 8, 9  # a loss event's capacity draws
LIFE = 10  # a slot's fresh loss clock (+ node rank)
CO_LOSS = 11  # a slot's co-loss (+ node rank)


def mix(x: U64) -> U64:
    """splitmix64: one step of the sequence, then its finaliser (a bijection of uint64).
    In place on a fresh array (arrays wrap silently; a 0-d input takes the scalar path, whose
    overflow numpy would report)."""
    z = np.add(x, _GAMMA, dtype=np.uint64)
    if not isinstance(z, np.ndarray) or z.ndim == 0:
        with np.errstate(over="ignore"):
            y = np.uint64(z)
            y = (y ^ (y >> _S30)) * _M1
            y = (y ^ (y >> _S27)) * _M2
            return np.asarray(y ^ (y >> _S31))
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def _u64(x: NDArray[np.integer] | int) -> U64:
    return np.asarray(x).astype(np.uint64)


def lane_keys(key: U64, run: NDArray[np.integer]) -> U64:
    """Each lane's stream key: its configuration's key and its run index, hashed."""
    return mix(_u64(key) ^ mix(_u64(run)))


def uniform(lane: U64, event: NDArray[np.integer], slot: object) -> NDArray[np.float64]:
    """Uniforms in (0, 1) (never 0 nor 1) from the hash of (lane key, event, slot), broadcast."""
    h = mix(mix(lane ^ _u64(event)) ^ _u64(np.asarray(slot, dtype=np.int64)))
    out: NDArray[np.float64] = ((h >> _S11).astype(np.float64) + 0.5) * _STEP
    return out


def exponential(lane: U64, event: NDArray[np.integer], slot: object) -> NDArray[np.float64]:
    """Exp(1) draws: ``-log(u)``."""
    out: NDArray[np.float64] = -np.log(uniform(lane, event, slot))
    return out


def normal(lane: U64, event: NDArray[np.integer], slot_a: int, slot_b: int) -> NDArray[np.float64]:
    """N(0, 1) draws: Box-Muller from the uniforms of two slots."""
    u1 = uniform(lane, event, slot_a * SLOT_SPAN)
    u2 = uniform(lane, event, slot_b * SLOT_SPAN)
    out: NDArray[np.float64] = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return out


def row_keys(rows: Sequence[object], seed: int) -> U64:
    """One 64-bit key per row from its identity (its ``repr``: a tuple of the row's defining
    values) and ``seed``: equal rows draw equal streams, wherever they sit in a batch."""
    raw = [
        int.from_bytes(hashlib.blake2b(repr(r).encode(), digest_size=8).digest(), "little")
        for r in rows
    ]
    keys = np.array(raw, dtype=np.uint64)
    return mix(keys ^ mix(np.array([seed & (2**64 - 1)], dtype=np.uint64)))

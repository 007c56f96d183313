"""One synchronised step's communication for a gradient-compression option: the bytes, rounds
and hops one worker sends (``traffic``, the table in kplan/planner/compression.py's notes), and
those terms per configuration for ``compression.sync_time`` (``sync_terms``): read from columns
indexed by the worker count, filled once per (gradient layout, option), where the option's
traffic depends on the count alone (all but top-k's ``auto``, whose AR/AG choice needs the
link)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from kplan.core import compression_spec as rc
from kplan.core.compression_spec import Compression
from kplan.planner.perfmodel import PerfParams

Array = NDArray[np.float64]
Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Traffic:
    """One synchronised step's communication for one worker (per bucket: ``hops``)."""

    bytes: float  # sent by one worker over the step (the bottleneck link's load)
    rounds: int  # collective rounds per bucket (their hops are counted in ``hops``)
    hops: float  # sequential messages per bucket (each pays the per-hop latency)
    collective: str  # "ar"/"ag" for top-k, "" otherwise
    blocking_bytes: float = 0.0  # of ``bytes``: in rounds the hook waits for (not overlapped)
    blocking_hops: float = 0.0  # of ``hops``: the same rounds' messages, per bucket
    barrier: bool = False  # the blocking round needs every worker's part (skew is paid)


def traffic(
    c: Compression, shapes: Sequence[tuple[int, ...]], workers: int, bandwidth_Bps: float,
    latency_s: float,
) -> Traffic:  # fmt: skip
    """Bytes, rounds and hops of ``c`` on ``workers`` (the AR/AG of ``auto`` by the runtime's
    cost function at ``bandwidth_Bps`` and ``latency_s`` per hop)."""
    k = workers
    if k <= 1:
        return Traffic(0.0, 0, 0.0, "")
    if c.kind in ("none", "fp16", "bf16"):
        return Traffic(rc.wire_bytes(c, shapes, k), 1, 2.0 * (k - 1), "")
    if c.kind == "powersgd":
        # P's round is waited for inside the hook (Q = M^T P needs the summed P)
        p_elems, _, _ = rc.powersgd_elements(c.rank, shapes)
        p_bytes = rc.ring_allreduce_bytes(rc.VALUE_BYTES * p_elems, k)
        hops = 2.0 * (k - 1)
        return Traffic(rc.wire_bytes(c, shapes, k), 2, 2 * hops, "", p_bytes, hops, True)
    coll: Literal["ar", "ag"]
    if c.collective == "auto":
        numel = sum(math.prod(s) for s in shapes)
        coll = rc.topk_collective(numel, c.ratio, k, bandwidth_Bps, latency_s).choice
    else:
        coll = "ar" if c.collective == "ar" else "ag"
    if coll == "ag":
        return Traffic(rc.wire_bytes(c, shapes, k, "ag"), 2, float(2 * (k - 1)), "ag")
    # AR: the broadcast's critical path is ceil(log2 k) sends of all K indices (a tree), as in
    # the runtime's cost function; then the ring all-reduce of the K values.
    # The broadcast is waited for inside the hook (the values sent depend on the indices), but
    # it is no barrier: the others wait for the designated worker's selection (its codec time),
    # and it waits for no one.
    kk = sum(rc.topk_count(math.prod(s), c.ratio) for s in shapes)
    tree = math.ceil(math.log2(k))
    bcast = tree * rc.INDEX_BYTES * kk
    nbytes = bcast + rc.ring_allreduce_bytes(rc.VALUE_BYTES * kk, k)
    return Traffic(nbytes, 2, tree + 2.0 * (k - 1), "ar", bcast, float(tree))


# traffic() per gradient layout, then per (option, workers, bandwidth, latency): the layout
# (a model's hundreds of shapes) is hashed once per sync_time call, not once per entry
_TRAFFIC: dict[Shapes, dict[tuple[Compression, int, float, float], Traffic]] = {}


def _traffic_table(shapes: Shapes) -> dict[tuple[Compression, int, float, float], Traffic]:
    if shapes not in _TRAFFIC:
        if len(_TRAFFIC) >= 64:
            _TRAFFIC.clear()
        _TRAFFIC[shapes] = {}
    return _TRAFFIC[shapes]


def _traffic_cached(
    table: dict[tuple[Compression, int, float, float], Traffic],
    c: Compression,
    shapes: Shapes,
    k: int,
    bw: float,
    lat: float,
) -> Traffic:
    if c.kind in ("none", "fp16", "bf16", "powersgd") or c.collective != "auto":
        bw, lat = 0.0, 0.0  # the link matters only to a sparse option's auto choice
    key = (c, k, bw, lat)
    t = table.get(key)
    if t is None:
        t = table[key] = traffic(c, shapes, k, bw, lat)
    return t


def sync_terms(
    p: PerfParams,
    c: Compression,
    shapes: Sequence[tuple[int, ...]],
    n: Array,
    k: Array,
    part: Literal["all", "overlapped", "blocking"],
    skew_s: float,
) -> tuple[Array, Array, Array, list[str]]:
    """(bytes, hops per bucket, barrier wait, collective) of ``part`` per entry. An option whose
    traffic depends on the worker count alone (all but top-k's ``auto``) reads it from columns
    indexed by that count, filled once per (layout, option): no per-entry work in Python."""
    shape_key = tuple(tuple(sh) for sh in shapes)
    whole = bool(k.size) and bool(np.all(k == np.round(k))) and float(k.min()) >= 0
    if whole and not (c.sparse and c.collective == "auto"):
        cols = _columns(shape_key, c, k.astype(np.intp))
        ki = k.astype(np.intp)
        if part == "all":
            b, h = cols.bytes[ki], cols.hops[ki]
            wait = np.zeros(k.shape)
        elif part == "blocking":
            b, h = cols.blocking_bytes[ki], cols.blocking_hops[ki]
            wait = np.where(cols.barrier[ki], skew_s, 0.0)  # once a step (module notes)
        else:
            b = cols.bytes[ki] - cols.blocking_bytes[ki]
            h = cols.hops[ki] - cols.blocking_hops[ki]
            wait = np.zeros(k.shape)
        return b, h, wait, [_COLLECTIVES[int(j)] for j in cols.collective[ki].ravel()]
    pbytes = float(p.gradient_bytes or 4 * sum(math.prod(s) for s in shapes))
    memo = _traffic_table(shape_key)
    keys = np.stack([k.ravel(), (n.ravel() > 1).astype(float)], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    t_bytes, t_hops, t_wait = np.zeros(len(uniq)), np.zeros(len(uniq)), np.zeros(len(uniq))
    names: list[str] = []
    for j, (kk, inter) in enumerate(uniq):
        pb = float(p.inter_beta if inter else p.intra_beta) / pbytes
        t = _traffic_cached(
            memo,
            c,
            shape_key,
            int(kk),
            1.0 / pb if pb > 0 else 1e18,
            p.inter_lat if inter else p.intra_lat,
        )
        if part == "all":
            t_bytes[j], t_hops[j] = t.bytes, t.hops
        elif part == "blocking":
            t_bytes[j], t_hops[j] = t.blocking_bytes, t.blocking_hops
            t_wait[j] = skew_s if t.barrier else 0.0  # once a step (module notes)
        else:
            t_bytes[j], t_hops[j] = t.bytes - t.blocking_bytes, t.hops - t.blocking_hops
        names.append(t.collective)
    inv = inverse.reshape(k.shape)
    return t_bytes[inv], t_hops[inv], t_wait[inv], [names[int(j)] for j in inv.ravel()]


@dataclass
class _Columns:
    """``traffic`` of one option on one gradient layout, indexed by the worker count (the
    counts asked for so far; ``filled`` marks them)."""

    filled: NDArray[np.bool_]
    bytes: Array
    hops: Array
    blocking_bytes: Array
    blocking_hops: Array
    barrier: NDArray[np.bool_]
    collective: NDArray[np.int8]  # index into _COLLECTIVES


_COLUMNS: dict[tuple[Shapes, Compression], _Columns] = {}
_COLLECTIVES = ("", "ar", "ag")


def _columns(shape_key: Shapes, c: Compression, k: NDArray[np.intp]) -> _Columns:
    """The option's traffic columns with every count in ``k`` filled (grown as needed)."""
    key = (shape_key, c)
    cols = _COLUMNS.get(key)
    top = int(k.max()) + 1
    if cols is None or cols.filled.size < top:
        size = max(top, 64 if cols is None else 2 * cols.filled.size)
        grown = _Columns(
            np.zeros(size, dtype=bool), np.zeros(size), np.zeros(size), np.zeros(size),
            np.zeros(size), np.zeros(size, dtype=bool), np.zeros(size, dtype=np.int8),
        )  # fmt: skip
        if cols is not None:
            for name in _Columns.__dataclass_fields__:
                getattr(grown, name)[: cols.filled.size] = getattr(cols, name)
        if len(_COLUMNS) >= 256:
            _COLUMNS.clear()
        cols = _COLUMNS[key] = grown
    asked = np.zeros(top, dtype=bool)
    asked[k.ravel()] = True
    for kk in np.flatnonzero(asked & ~cols.filled[:top]).tolist():
        t = traffic(c, shape_key, kk, 0.0, 0.0)  # the link plays no part here
        cols.bytes[kk], cols.hops[kk] = t.bytes, t.hops
        cols.blocking_bytes[kk], cols.blocking_hops[kk] = t.blocking_bytes, t.blocking_hops
        cols.barrier[kk], cols.filled[kk] = t.barrier, True
        cols.collective[kk] = _COLLECTIVES.index(t.collective)
    return cols

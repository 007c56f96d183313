"""All-reduce microbenchmark of the job's gradient size, run by the workers after the job.

It times ``all_reduce`` of one fp32 buffer of ``gradient_bytes`` (the size DDP reduces each
step, in buckets) so the planner sees the bare collective cost next to the exposed sync time
of the training steps. A fresh process group is built on a TCP store that rank 0 hosts on
127.0.0.1 at ``KPLAN_PROFILE_BENCH_PORT`` (the profiler picks the port).
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

from kplan.core.records import ModelEvent, RecordError

BENCH_PORT_ENV = "KPLAN_PROFILE_BENCH_PORT"


def model_record(metrics: Path) -> ModelEvent | None:
    """The runtime's last ``model`` record in ``metrics`` (None: no file or no such record; a
    line that does not parse as one is passed over)."""
    try:
        lines = metrics.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            raw = json.loads(line)
        except ValueError:
            continue
        if isinstance(raw, dict) and raw.get("event") == "model":
            try:
                return ModelEvent.from_dict(raw)
            except RecordError:
                continue
    return None


def gradient_bytes_from(metrics: Path) -> int | None:
    """The gradient size the runtime reported in its ``model`` record, if any."""
    rec = model_record(metrics)
    value = None if rec is None else rec.gradient_bytes
    return value if value is not None and value > 0 else None


def time_allreduce(nbytes: int, repeats: int | None = None) -> float:
    """Mean seconds of one all-reduce of ``nbytes`` over the default process group.

    Every rank must run the same number of rounds, so it depends on ``nbytes`` only.
    """
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)

    def once() -> float:
        if device.type == "cuda":
            dist.barrier(device_ids=[device.index])
        else:
            dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(buf)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    once()  # warm up: connections, buffers
    rounds = repeats if repeats is not None else (10 if nbytes < 64 * 2**20 else 3)
    times = [once() for _ in range(rounds)]
    return sum(times) / len(times)


def bench_after_job(metrics: Path) -> None:
    """In each worker after the job: time the all-reduce and let rank 0 append the record."""
    import torch
    import torch.distributed as dist

    port = os.environ.get(BENCH_PORT_ENV)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    nbytes = gradient_bytes_from(metrics)
    if not port or world < 2 or nbytes is None:
        return
    owned = not dist.is_initialized()
    if owned:
        use_nccl = torch.cuda.is_available()
        if use_nccl:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        store = dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1", int(port), world, is_master=rank == 0, timeout=timedelta(seconds=60)
        )
        dist.init_process_group(
            "nccl" if use_nccl else "gloo",
            store=store,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=60),
        )
    try:
        seconds = time_allreduce(nbytes)
        if rank == 0:
            record = {
                "event": "allreduce",
                "nbytes": nbytes,
                "seconds": seconds,
                "world_size": world,
                "backend": dist.get_backend(),
            }
            with metrics.open("a") as f:
                f.write(json.dumps(record) + "\n")
    finally:
        if owned:
            dist.destroy_process_group()

"""The top-k-with-momentum scenario run by torchrun: each worker trains every named option.

``run_scenario`` starts 2 gloo workers running this file; tests/test_runtime_compress_momentum.py
asserts on what they save and bench/runtime_compress_momentum.py prints it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bench.runtime_common import clean_env, torchrun


def run_scenario(tmp: Path, options: list[str], phases: list[str], timeout: float = 170) -> Any:
    """Run the scenario's ``tag|steps|checkpoint root`` phases in one 2-worker torchrun; per
    tag, each rank's results per option, and the run's output."""
    args = ["train", str(tmp), ",".join(options), ",".join(phases)]
    proc = torchrun(args, clean_env(), nproc=2, script=Path(__file__), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-4000:])
    import torch

    tags = [p.split("|")[0] for p in phases]
    return {t: [torch.load(tmp / f"{t}.rank{r}.pt") for r in (0, 1)] for t in tags}, proc.stdout


def _optimizer(name: str, params: Any, lr: float | None) -> Any:
    """The named optimizer; ``lr`` (the option's ``lr=X`` flag) overrides its default LR."""
    import torch

    if name == "sgdm":
        return torch.optim.SGD(params, lr=lr or 0.01, momentum=0.9)
    if name == "nesterov":
        return torch.optim.SGD(params, lr=lr or 0.01, momentum=0.9, nesterov=True)
    if name == "sgdm_wd":  # weight decay and dampening
        return torch.optim.SGD(
            params, lr=lr or 0.01, momentum=0.9, weight_decay=1e-3, dampening=0.1
        )
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr or 0.1)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr or 0.003)
    raise SystemExit(f"unknown optimizer {name!r}")


def _train(folder: Path, tag: str, steps: int, options: list[str], ckpt_root: str) -> None:
    import torch
    import torch.nn.functional as F

    import kplan.runtime as kr
    from bench.runtime_worker import make_data, make_model

    ctx = kr.init()
    data = make_data(3072, 16, 0, 0.5)
    x_all, y_all = data.tensors
    result: dict[str, Any] = {}
    for name in options:
        # COMPRESSION/OPTIMIZER[/nogns][/manual][/lr=X][/h=WIDTH]
        compression, opt_name, *flags = name.split("/")
        values = dict(f.split("=") for f in flags if "=" in f)
        torch.manual_seed(0)
        model = make_model("mlp", 16, int(values.get("h", 32)))
        opt = _optimizer(opt_name, model.parameters(), float(values.get("lr", 0)) or None)
        safe = name.replace(":", "_").replace("/", "-").replace("=", "")
        ckpt = None if ckpt_root == "-" else Path(ckpt_root) / safe
        metrics = folder / f"{tag}-{safe}.jsonl"
        metrics.unlink(missing_ok=True)
        cfg = kr.RuntimeConfig(
            compression=compression,
            max_local_batch=16 if ctx.rank == 0 else None,  # unequal split (16, 48)
            pid=None,
            lr_scaling="none",
            max_steps=steps,
            checkpoint_dir=ckpt,
            checkpoint_steps=10 if ckpt else 0,
            metrics_path=metrics,
            gns="off" if "nogns" in flags else "auto",
            sync="manual" if "manual" in flags else "overlap",
        )
        job = kr.Job(model, opt, data, batch_size=64, config=cfg)
        resumed = job.step_count if job.step_count else None
        curve = []
        for _ in job.epochs(100):
            for x, y in job.batches():
                with job.step():
                    loss = F.mse_loss(job.model(x), y)
                    job.backward(loss)
                curve.append(float(loss))
        with torch.no_grad():
            final = float(F.mse_loss(job.module(x_all), y_all))
        comp = job._state.compressor
        state = {} if comp is None else comp.state_dict()
        result[name] = {
            "params": torch.cat([p.detach().reshape(-1) for p in job.module.parameters()]),
            "eval_loss": final,
            "curve": curve,
            "resumed_at": resumed,
            "state": state,
            "gns": job.gns,
        }
    torch.save(result, folder / f"{tag}.rank{ctx.rank}.pt")


if __name__ == "__main__":
    if sys.argv[1] == "train":
        for phase in sys.argv[4].split(","):
            tag, steps, ckpt = phase.split("|")
            _train(Path(sys.argv[2]), tag, int(steps), sys.argv[3].split(","), ckpt)
    else:
        raise SystemExit(f"unknown scenario {sys.argv[1]!r}")

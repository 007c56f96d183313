"""The examples' real architectures (kplan/examples/models): published sizes, and the shipped
graphs are what tracing gives (scripts/trace_examples.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kplan.app import planning  # noqa: E402
from kplan.examples.models import MODELS  # noqa: E402
from kplan.profiler.opgraph_trace import trace_model  # noqa: E402
from scripts.trace_examples import trace_example  # noqa: E402


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_counts_are_the_published_ones(name: str) -> None:
    m = MODELS[name]
    with torch.device("meta"):
        count = sum(p.numel() for p in m.build().parameters())
    assert count == pytest.approx(m.parameters, rel=0.01)


def test_resnet18_imagenet_head_has_the_published_11_7m() -> None:
    from kplan.examples.models.vision import ResNet

    with torch.device("meta"):
        count = sum(p.numel() for p in ResNet(18).parameters())
    assert count == pytest.approx(11.69e6, rel=0.005)


@pytest.mark.parametrize("name", ["imagenet-resnet50", "cifar10-resnet18"])
def test_forward_macs_per_sample_are_the_published_ones(name: str) -> None:
    m = MODELS[name]
    g = trace_model(m.build, m.batch, m.loss, m.optimizer, local_batch=2)
    heavy = ("matmul", "conv", "attention")
    flops = sum(o.flops * o.count for o in g.ops if o.phase == "forward" and o.kind in heavy)
    assert m.forward_gmacs is not None
    assert flops / 2 / 2 / 1e9 == pytest.approx(m.forward_gmacs, rel=0.02)


def test_cifar10_resnet18_retraces_to_the_shipped_graph() -> None:
    shipped = planning.load_example("cifar10-resnet18").opgraph
    assert shipped is not None
    again = trace_example("cifar10-resnet18", shipped.local_batch)
    assert sorted(again.ops, key=lambda o: o.key()) == sorted(shipped.ops, key=lambda o: o.key())

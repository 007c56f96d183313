"""Real architectures of kplan's built-in examples, in torch, for tracing their operator graphs
(``kplan.profiler.opgraph_trace.trace_model``; scripts/trace_examples.py writes the graphs into
kplan/planner/examples/*.json). No weights, no data, no downloads: each entry builds the model,
a batch of the right shapes and dtypes, the loss and the optimizer the published recipe uses.

``parameters`` and ``forward_gmacs`` (multiply-adds of one sample's forward pass) are the
published figures the models are checked against (tests/test_opgraph_examples.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from kplan.examples.models.recsys import NeuMF
from kplan.examples.models.speech import DeepSpeech2
from kplan.examples.models.text import Bert, Gpt2
from kplan.examples.models.vision import ResNet, YoloV3


@dataclass(frozen=True)
class ExampleModel:
    name: str
    build: Callable[[], torch.nn.Module]
    batch: Callable[[int], Any]  # local batch -> (inputs, targets)
    loss: Callable[[torch.nn.Module, Any], torch.Tensor]
    optimizer: Callable[[Any], torch.optim.Optimizer]
    parameters: float  # published parameter count
    forward_gmacs: float | None  # published multiply-adds per sample, forward (None: not used)
    what: str  # input shapes and what the loss stands for


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=True)


def _adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, foreach=True)


def _images(side: int, classes: int) -> Callable[[int], Any]:
    return lambda b: (torch.randn(b, 3, side, side), torch.randint(0, classes, (b,)))


def _classify(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _span(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    logits = model(batch[0]).float()
    start, end = batch[1][:, 0], batch[1][:, 1]
    return (F.cross_entropy(logits[..., 0], start) + F.cross_entropy(logits[..., 1], end)) / 2


def _lm(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    logits = model(batch[0])
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[1].flatten())


def _frames(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    # CTC has no shape-only (meta) kernel: a per-frame NLL over the same log-probabilities
    # stands in for it (both are a pass over the B x T x 29 outputs).
    logp = model(batch[0]).float()
    return F.nll_loss(logp.flatten(0, 1), batch[1].flatten())


def _yolo(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    # The YOLO loss is elementwise over the three prediction maps: a squared error stands in.
    total = torch.zeros(())
    for p, t in zip(model(batch[0]), batch[1], strict=True):
        total = total + (p.float() - t).pow(2).mean()
    return total


def _yolo_batch(b: int, side: int = 416, classes: int = 80) -> Any:
    maps = [torch.zeros(b, 3 * (5 + classes), side // s, side // s) for s in (32, 16, 8)]
    return torch.randn(b, 3, side, side), maps


def _ncf(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(model(batch[0]).float(), batch[1])


MODELS: dict[str, ExampleModel] = {
    m.name: m
    for m in (
        ExampleModel("cifar10-resnet18", lambda: ResNet(18, 10, cifar=True), _images(32, 10),
                     _classify, _sgd, 11.17e6, 0.556,
                     "3x32x32 images, 10 classes, cross-entropy; SGD with momentum"),
        ExampleModel("imagenet-resnet50", lambda: ResNet(50), _images(224, 1000), _classify,
                     _sgd, 25.56e6, 4.1,
                     "3x224x224 images, 1000 classes, cross-entropy; SGD with momentum"),
        ExampleModel("bert-squad", Bert,
                     lambda b: (torch.randint(0, 30522, (b, 384)), torch.randint(0, 384, (b, 2))),
                     _span, _adamw, 110e6, None,
                     "384-token sequences, start/end cross-entropy (SQuAD); AdamW"),
        ExampleModel("deepspeech2", DeepSpeech2,
                     lambda b: (torch.randn(b, 1, 161, 700), torch.randint(1, 29, (b, 350))),
                     _frames, _sgd, 38.0e6, None,
                     "161 x 700-frame spectrograms (7 s); a per-frame NLL stands in for CTC "
                     "(no shape-only CTC kernel); the GRUs as the CPU kernels run them, one cell "
                     "per time step; SGD with momentum"),
        ExampleModel("yolov3", YoloV3, _yolo_batch, _yolo, _sgd, 61.95e6, 32.8,
                     "3x416x416 images, 80 classes; squared error on the 3 prediction maps "
                     "(stands in for the elementwise YOLO loss); SGD with momentum"),
        ExampleModel("ncf", NeuMF,
                     lambda b: (torch.stack([torch.randint(0, 138_493, (b,)),
                                             torch.randint(0, 26_744, (b,))], 1),
                                torch.rand(b)),
                     _ncf, lambda p: torch.optim.Adam(p, lr=1e-3, foreach=True), 31.8e6, None,
                     "(user, item) pairs of MovieLens-20M, binary cross-entropy; Adam"),
        ExampleModel("gpt2-small", Gpt2,
                     lambda b: (torch.randint(0, 50257, (b, 1024)),
                                torch.randint(0, 50257, (b, 1024))),
                     _lm, _adamw, 124.4e6, None,
                     "1024-token sequences, next-token cross-entropy; AdamW"),
    )
}  # fmt: skip

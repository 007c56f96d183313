"""ResNet-18/50 (He et al. 2016) and YOLOv3 (Redmon & Farhadi 2018: Darknet-53 and three
detection heads), as published, for tracing their operator graphs (no weights, no data)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def conv_bn(
    cin: int, cout: int, k: int, stride: int = 1, act: nn.Module | None = None
) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, k, stride, k // 2, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act is not None:
        layers.append(act)
    return nn.Sequential(*layers)


class Basic(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            conv_bn(cin, width, 3, stride, nn.ReLU(inplace=True)), conv_bn(width, width, 3)
        )
        self.skip = conv_bn(cin, width, 1, stride) if stride != 1 or cin != width else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        out = width * 4
        self.body = nn.Sequential(
            conv_bn(cin, width, 1, 1, nn.ReLU(inplace=True)),
            conv_bn(width, width, 3, stride, nn.ReLU(inplace=True)),
            conv_bn(width, out, 1),
        )
        self.skip = conv_bn(cin, out, 1, stride) if stride != 1 or cin != out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


class ResNet(nn.Module):
    """``depth`` 18 (basic blocks) or 50 (bottlenecks); ``cifar``: the 3x3 stem without max
    pooling that CIFAR-10 training uses (32x32 inputs)."""

    def __init__(self, depth: int = 50, classes: int = 1000, cifar: bool = False) -> None:
        super().__init__()
        block: type[Basic] | type[Bottleneck] = Basic if depth == 18 else Bottleneck
        counts = {18: (2, 2, 2, 2), 50: (3, 4, 6, 3)}[depth]
        if cifar:
            self.stem: nn.Module = conv_bn(3, 64, 3, 1, nn.ReLU(inplace=True))
        else:
            self.stem = nn.Sequential(
                conv_bn(3, 64, 7, 2, nn.ReLU(inplace=True)), nn.MaxPool2d(3, 2, 1)
            )
        stages: list[nn.Module] = []
        cin = 64
        for i, (n, width) in enumerate(zip(counts, (64, 128, 256, 512), strict=True)):
            for j in range(n):
                stages.append(block(cin, width, 2 if j == 0 and i > 0 else 1))
                cin = width * block.expansion
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        logits: torch.Tensor = self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return logits


def _leaky() -> nn.Module:
    return nn.LeakyReLU(0.1, inplace=True)


class DarkResidual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            conv_bn(c, c // 2, 1, 1, _leaky()), conv_bn(c // 2, c, 3, 1, _leaky())
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = x + self.body(x)
        return y


class Darknet53(nn.Module):
    """The backbone: returns the feature maps at strides 8, 16 and 32."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = conv_bn(3, 32, 3, 1, _leaky())
        stages = []
        cin = 32
        for n in (1, 2, 8, 8, 4):
            layers: list[nn.Module] = [conv_bn(cin, cin * 2, 3, 2, _leaky())]
            layers += [DarkResidual(cin * 2) for _ in range(n)]
            stages.append(nn.Sequential(*layers))
            cin *= 2
        self.stages = nn.ModuleList(stages)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outs = []
        for stage in self.stages:
            x = stage(x)
            outs.append(x)
        return outs[2:]


class YoloHead(nn.Module):
    """Five alternating 1x1/3x3 convolutions (the branch to the next scale leaves after the
    fifth), then a 3x3 and the 1x1 prediction of 3 anchors x (5 + classes)."""

    def __init__(self, cin: int, c: int, classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            conv_bn(cin, c, 1, 1, _leaky()), conv_bn(c, c * 2, 3, 1, _leaky()),
            conv_bn(c * 2, c, 1, 1, _leaky()), conv_bn(c, c * 2, 3, 1, _leaky()),
            conv_bn(c * 2, c, 1, 1, _leaky()),
        )  # fmt: skip
        self.out = nn.Sequential(
            conv_bn(c, c * 2, 3, 1, _leaky()), nn.Conv2d(c * 2, 3 * (5 + classes), 1)
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        branch = self.body(x)
        return branch, self.out(branch)


class YoloV3(nn.Module):
    def __init__(self, classes: int = 80) -> None:
        super().__init__()
        self.backbone = Darknet53()
        self.head1 = YoloHead(1024, 512, classes)
        self.lat1 = conv_bn(512, 256, 1, 1, _leaky())
        self.head2 = YoloHead(512 + 256, 256, classes)
        self.lat2 = conv_bn(256, 128, 1, 1, _leaky())
        self.head3 = YoloHead(256 + 128, 128, classes)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        c3, c4, c5 = self.backbone(x)
        b1, p1 = self.head1(c5)
        up1 = nn.functional.interpolate(self.lat1(b1), scale_factor=2.0, mode="nearest")
        b2, p2 = self.head2(torch.cat([up1, c4], 1))
        up2 = nn.functional.interpolate(self.lat2(b2), scale_factor=2.0, mode="nearest")
        _, p3 = self.head3(torch.cat([up2, c3], 1))
        return [p1, p2, p3]

"""A small ResNet on synthetic CIFAR-shaped images (3x32x32, 10 classes), on kplan.runtime.

The images are generated deterministically (no download): each class has a smooth random
template; a sample is its class template plus noise, so the task is learnable but not trivial.

    python kplan/examples/resnet_cifar.py --epochs 2
    torchrun --nproc_per_node=2 kplan/examples/resnet_cifar.py --epochs 2
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import kplan.runtime as kr


def synthetic_cifar(samples: int, seed: int = 0) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    templates = F.avg_pool2d(torch.randn(10, 3, 32, 32, generator=g), 5, stride=1, padding=2)
    labels = torch.randint(0, 10, (samples,), generator=g)
    images = 3.0 * templates[labels] + torch.randn(samples, 3, 32, 32, generator=g)
    return torch.utils.data.TensorDataset(images, labels)


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Sequential()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.skip(x))


class ResNet(nn.Module):
    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width))
        self.stages = nn.Sequential(
            Block(width, width, 1), Block(width, 2 * width, 2), Block(2 * width, 4 * width, 2)
        )
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(F.relu(self.stem(x)))
        logits: torch.Tensor = self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))
        return logits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128, help="global batch (all workers)")
    p.add_argument("--samples", type=int, default=5000, help="training images to generate")
    p.add_argument("--width", type=int, default=16, help="channels of the first stage")
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()

    ctx = kr.init()
    model = ResNet(args.width).to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    job = kr.Job(model, optimizer, synthetic_cifar(args.samples), batch_size=args.batch_size)
    for epoch in job.epochs(args.epochs):
        total, count = 0.0, 0
        for x, y in job.batches():
            with job.step():
                loss = F.cross_entropy(job.model(x), y)
                job.backward(loss)
            total, count = total + loss.item(), count + 1
        if ctx.rank == 0 and count:
            print(f"epoch {epoch} loss {total / count:.4f} global batch {job.global_batch}")


if __name__ == "__main__":
    main()

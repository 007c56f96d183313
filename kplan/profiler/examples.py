"""The built-in example jobs that ``kplan profile --example NAME`` runs.

Each entry names a script in ``kplan.examples`` and the work and sweep that suit it on a CPU
(small enough for a whole profile in well under a minute) unless the user overrides them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kplan.core.errors import InputError


@dataclass(frozen=True)
class Example:
    name: str
    filename: str  # in the kplan.examples package folder
    description: str
    dataset_size: int  # samples per epoch of the real-size job it stands for
    epochs: float
    base_batch: int  # global
    max_local_batch: int  # sweep ceiling on a CPU
    args: tuple[str, ...] = ()  # extra script flags for profiling

    @property
    def path(self) -> Path:
        from kplan import examples

        return Path(examples.__file__).resolve().parent / self.filename


EXAMPLES: dict[str, Example] = {
    e.name: e
    for e in (
        Example(
            name="resnet-cifar",
            filename="resnet_cifar.py",
            description="small ResNet on synthetic CIFAR-shaped images (10 classes)",
            dataset_size=50_000,
            epochs=30,
            base_batch=128,
            max_local_batch=64,
        ),
        Example(
            name="char-transformer",
            filename="char_transformer.py",
            description="character-level transformer on a short public-domain text",
            dataset_size=100_000,
            epochs=10,
            base_batch=64,
            max_local_batch=64,
        ),
        Example(
            name="mlp-regression",
            filename="mlp_regression.py",
            description="MLP regression on generated data",
            dataset_size=200_000,
            epochs=20,
            base_batch=256,
            max_local_batch=256,
        ),
    )
}


def get_example(name: str) -> Example:
    """The example called ``name``; InputError listing the known ones otherwise."""
    try:
        return EXAMPLES[name]
    except KeyError:
        known = ", ".join(sorted(EXAMPLES))
        raise InputError(f"unknown example {name!r}", hint=f"known examples: {known}") from None

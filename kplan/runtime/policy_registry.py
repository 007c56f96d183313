"""The policy registry: the built-in policies by name, and ``KPLAN_POLICIES`` items (a built-in
name, ``path/to/file.py:Class`` or ``module:Class``) loaded as instances.

The policy API (policy.py) knows nothing of the built-ins; they subclass it (builtin_policies.py)
and are named here, so the imports run one way: registry -> built-ins -> API.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kplan.core.errors import InputError
from kplan.runtime import env
from kplan.runtime.builtin_policies import GoodputBatch, StragglerReplace
from kplan.runtime.policy import Policy

BUILTIN: dict[str, type[Policy]] = {"goodput": GoodputBatch, "straggler": StragglerReplace}
"""The built-in policies by their ``KPLAN_POLICIES`` name."""


def load_policies(specs: Sequence[str]) -> list[Policy]:
    """Instances of ``KPLAN_POLICIES`` items: built-in name, ``file.py:Class``, ``module:Class``."""
    return [load_policy(spec) for spec in specs]


def load_policy(spec: str) -> Policy:
    """One ``KPLAN_POLICIES`` item as a policy instance (one line and a hint when it fails)."""
    if spec in BUILTIN:
        return BUILTIN[spec]()
    where, _, name = spec.rpartition(":")
    hint = f"{env.POLICIES} items are goodput, straggler, path/to/file.py:Class or module:Class"
    if where.endswith(".py") or "/" in where or os.sep in where:
        module = _load_file(where, spec, hint)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as err:
            msg = f"{env.POLICIES}: {spec!r}: cannot import {where!r}: {err}"
            raise InputError(msg, hint) from err
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise InputError(
            f"{env.POLICIES}: {spec!r}: {name!r} is not a kplan.runtime.Policy subclass",
            "define `class Name(kplan.runtime.Policy)` in that file or module",
        )
    try:
        return cls()
    except TypeError as err:
        raise InputError(f"{env.POLICIES}: {spec!r}: {name}() failed: {err}", hint) from err


def _load_file(where: str, spec: str, hint: str) -> Any:
    path = Path(where).expanduser()
    if not path.is_absolute() and not path.is_file() and sys.argv and sys.argv[0]:
        beside = Path(sys.argv[0]).resolve().parent / path  # relative to the training script
        path = beside if beside.is_file() else path
    if not path.is_file():
        raise InputError(f"{env.POLICIES}: {spec!r}: no file {where}", hint)
    path = path.resolve()
    module_name = f"kplan_policy_{path.stem}_{abs(hash(str(path))):x}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise InputError(f"{env.POLICIES}: {spec!r}: {path} is not a Python file", hint)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up here
    try:
        loader_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise InputError(
            f"{env.POLICIES}: {spec!r}: importing {path} failed: {type(err).__name__}: {err}", hint
        ) from err
    return module

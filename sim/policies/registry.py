"""Policy registry: built-in names, a user's ``file.py:Class``, or a ``mmsim.policies`` entry point."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from pathlib import Path

from sim.errors import MmsimError

_REGISTRY: dict[str, type] = {}
BUILTIN_MODULES = ("static", "fcfs_swap", "time_slice", "swap_aware", "offload_aware", "slo_aware")


def register(cls: type) -> type:
    """Class decorator: make a policy available by its ``name``."""
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtins() -> None:
    for module in BUILTIN_MODULES:
        try:
            importlib.import_module(f"sim.policies.{module}")
        except ModuleNotFoundError as error:
            if error.name != f"sim.policies.{module}":
                raise


def _load_from_file(spec: str) -> type:
    path_text, _, class_name = spec.rpartition(":")
    path = Path(path_text)
    if not path.is_file():
        raise MmsimError(f"policy file {path} does not exist (expected path/to/file.py:ClassName)")
    module_spec = importlib.util.spec_from_file_location(f"mmsim_user_policy_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:  # a user's file: report its failure as input error
        raise MmsimError(f"cannot import policy file {path}: {type(error).__name__}: {error}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise MmsimError(f"policy file {path} has no class {class_name!r}")
    return cls


def get_policy_class(spec: str) -> type:
    """Resolve a policy name or ``path.py:Class`` to its class."""
    if ".py:" in spec:
        return _load_from_file(spec)
    _load_builtins()
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    for entry in importlib.metadata.entry_points(group="mmsim.policies"):
        if entry.name == spec:
            return entry.load()
    raise MmsimError(f"unknown policy {spec!r}; built-in policies: {', '.join(sorted(_REGISTRY))}, "
                     "or path/to/file.py:ClassName")


def make_policy(spec: str, params: dict | None = None):
    cls = get_policy_class(spec)
    try:
        return cls(**(params or {}))
    except (TypeError, ValueError) as error:
        raise MmsimError(f"bad parameters for policy {spec!r}: {error}") from None


def policy_descriptions() -> dict[str, str]:
    _load_builtins()
    return {name: cls.description for name, cls in sorted(_REGISTRY.items())}

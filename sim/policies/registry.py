"""Policy registry: built-in names, a user's ``file.py:Class``, or a ``mmsim.policies`` entry point."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sim.errors import MmsimError
from sim.files import cut
from sim.policies.contract import where_raised

if TYPE_CHECKING:
    from sim.policies.base import Policy

PolicyClass = TypeVar("PolicyClass", bound="type[Policy]")

_REGISTRY: dict[str, type[Policy]] = {}
BUILTIN_MODULES = ("static", "fcfs_swap", "time_slice", "swap_aware", "offload_aware", "slo_aware", "prefix_swap_aware")


def register(cls: PolicyClass) -> PolicyClass:
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


def is_policy_file(spec: str) -> bool:
    """Whether a policy spec names a Python file (``path.py:Class``), whose code loading it runs."""
    return ".py:" in spec


def check_policy_file_allowed(spec: str, *, allowed: bool, source: str, field: str = "policy.name") -> None:
    """A policy file named inside a data file (scenario, sweep) runs that file's code: only with the user's
    explicit ``--allow-policy-files``. A file given on the command line (``--policy``) needs no flag."""
    if is_policy_file(spec) and not allowed:
        kind = field.split(".")[0]
        raise MmsimError(f"{kind} {spec!r} is a Python file named in this file; loading it executes its code. "
                         f"Pass --allow-policy-files if you trust it (or give it on the command line with --{kind})",
                         source=source, field=field)


def load_class_from_file(spec: str, kind: str = "policy") -> type:
    """The class a ``path/to/file.py:ClassName`` spec names (a user's policy or autoscaler); runs the file."""
    path_text, _, class_name = spec.rpartition(":")
    path = Path(path_text)
    if not class_name.isidentifier() or class_name.startswith("__"):  # checked before the file's code runs
        raise MmsimError(f"{kind} {spec!r}: {class_name!r} is not a class name (expected path/to/file.py:ClassName)")
    if not os.path.isfile(path):
        raise MmsimError(f"{kind} file {path} does not exist or is not a regular file "
                         "(expected path/to/file.py:ClassName)")
    module_spec = importlib.util.spec_from_file_location(f"mmsim_user_{kind}_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:  # e.g. a.py:b.txt:Class names b.txt, no Python source
        raise MmsimError(f"cannot import {kind} file {path}: not a Python source file (expected path/to/file.py:ClassName)")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:  # a user's file: report its failure as input error
        raise MmsimError(f"cannot import {kind} file {path}: {type(error).__name__}: {error}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise MmsimError(f"{kind} file {path} has no class {class_name!r}")
    if not isinstance(cls, type):
        raise MmsimError(f"{kind} file {path}: {class_name!r} is not a class (it is {cut(repr(cls))})")
    return cls


def entry_point_class(group: str, name: str) -> type | None:
    """The class an installed package registers as ``name`` in the entry-point ``group``, if one does."""
    for entry in importlib.metadata.entry_points(group=group):
        if entry.name == name:
            return entry.load()
    return None


def apply_params(target: object, params: dict) -> None:
    """Set ``target``'s parameters (its class's ``param_defaults``) from ``params``; unknown ones are an error."""
    defaults = type(target).param_defaults()  # type: ignore[attr-defined]
    unknown = set(params) - set(defaults)
    if unknown:
        label = getattr(target, "name", "") or type(target).__name__
        raise ValueError(f"unknown parameter(s) {', '.join(sorted(unknown))}; {label} takes {', '.join(defaults) or 'none'}")
    for key, default in defaults.items():
        setattr(target, key, params.get(key, default))


def get_policy_class(spec: str) -> type:
    """Resolve a policy name or ``path.py:Class`` to its class."""
    if is_policy_file(spec):
        return load_class_from_file(spec)
    _load_builtins()
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    installed = entry_point_class("mmsim.policies", spec)
    if installed is not None:
        return installed
    raise MmsimError(f"unknown policy {spec!r}; built-in policies: {', '.join(sorted(_REGISTRY))}, "
                     "or path/to/file.py:ClassName")


MIN_PERIOD_S = 1e-3
"""Shortest time a ``*_s`` parameter may give (a timer of 1e-300 s would never let the clock advance)."""


def check_params(cls: type, params: dict, section: str = "policy") -> None:
    """Each parameter must have the type of its default: a finite number in [0, 1e9] (a whole one where the default
    is; a period, ``*_s`` but not a rate ``*_per_s``, at least MIN_PERIOD_S when the default is positive; within the
    class's ``param_limits()`` where it names the parameter), a boolean, or text. Other defaults are the class's to
    check."""
    defaults = cls.param_defaults() if hasattr(cls, "param_defaults") else {}
    limits = cls.param_limits() if hasattr(cls, "param_limits") else {}
    for key, value in params.items():
        default = defaults.get(key)
        field = f"{section}.params.{key}"
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise MmsimError(f"expected true or false, not {value!r:.40}", field=field)
        elif isinstance(default, (int, float)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise MmsimError(f"expected a finite number, not {value!r:.40}", field=field)
            if isinstance(default, int) and value != int(value):
                raise MmsimError(f"expected a whole number, not {value!r}", field=field)
            period = key.endswith("_s") and not key.endswith("_per_s") and default > 0
            low, high = limits.get(key, (MIN_PERIOD_S if period else 0.0, 1e9))
            if not low <= value <= high:
                raise MmsimError(f"expected a number from {low:g} to {high:g}, not {value!r}", field=field)
        elif isinstance(default, str) and not isinstance(value, str):
            raise MmsimError(f"expected text, not {value!r:.40}", field=field)


def make_policy(spec: str, params: dict | None = None):
    from sim.policies.base import Policy

    cls = get_policy_class(spec)
    check_params(cls, params or {})
    try:
        policy = cls(**(params or {}))
    except (Exception, SystemExit) as error:
        user = not cls.__module__.startswith("sim.")
        where = where_raised(error, cls) if user else None
        if where is None and isinstance(error, (TypeError, ValueError)):
            # Raised by the call itself, or by mmsim's own parameter checks: the parameters are what is wrong.
            raise MmsimError(f"bad parameters for policy {spec!r}: {error}") from None
        if not user:
            raise  # mmsim's own defect: its traceback is the report
        raise MmsimError(f"policy {spec!r} raised {type(error).__name__} while being made: {error}"
                         f"{'' if where is None else ' ' + where}", field="policy.name") from None
    if not isinstance(policy, Policy):  # the engine calls its hooks as a Policy's (compiled, they are typed)
        raise MmsimError(f"policy {spec!r} is not a subclass of sim.policies.base.Policy", field="policy.name")
    return policy


def policy_descriptions() -> dict[str, str]:
    _load_builtins()
    return {name: cls.description for name, cls in sorted(_REGISTRY.items())}

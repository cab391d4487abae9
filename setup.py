"""Build hook: compile the simulation engine's hot path with mypyc.

mypyc turns the same type-annotated source into C extensions (the way black
and mypy ship), which roughly doubles simulated requests per second; results
are identical, and ``tests/test_compiled.py`` holds the two builds to that.

The engine stays pure Python when ``MMSIM_PURE_PYTHON=1`` is set, in editable
installs (so that edits to the engine take effect without a rebuild), and
whenever compiling is impossible (no C compiler, mypy missing): the build then
says so on stderr and carries on.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED_MODULES = [
    "sim/costs.py",
    "sim/engine/arrivals.py",
    "sim/engine/batching.py",
    "sim/engine/engine.py",
    "sim/engine/events.py",
    "sim/engine/gpu.py",
    "sim/engine/instance.py",
    "sim/engine/kv.py",
    "sim/engine/limits.py",
    "sim/engine/preemption.py",
    "sim/engine/prefix.py",
    "sim/engine/recorder.py",
    "sim/engine/request.py",
    "sim/engine/residency.py",
    "sim/engine/routing.py",
    "sim/engine/sampler.py",
    "sim/engine/step.py",
    "sim/engine/timeshare.py",
    "sim/engine/transfers.py",
    "sim/layer_costs.py",
    "sim/parallel.py",
    # The built-in policies' hooks run for every request: compiled with the engine, they cost what its own code
    # does. Their classes allow interpreted subclasses, so a user's policy may still extend any of them.
    "sim/policies/base.py",
    "sim/policies/fcfs_swap.py",
    "sim/policies/offload_aware.py",
    "sim/policies/prefix_swap_aware.py",
    "sim/policies/slo_aware.py",
    "sim/policies/static.py",
    "sim/policies/swap_aware.py",
    "sim/policies/time_slice.py",
    "sim/policies/view.py",
]
BUILD_COMMANDS = {"build", "build_ext", "bdist_wheel", "install"}
"""Only these need the extensions; metadata steps (egg_info, dist_info) skip compiling."""


def _say(message: str) -> None:
    print(f"mmsim build: {message}", file=sys.stderr)


def compiled_extensions() -> list:
    if "editable_wheel" in sys.argv or not BUILD_COMMANDS & set(sys.argv):
        return []
    if os.environ.get("MMSIM_PURE_PYTHON") == "1":
        _say("MMSIM_PURE_PYTHON=1: the engine stays pure Python")
        return []
    try:
        from mypyc.build import mypycify

        return mypycify(COMPILED_MODULES, opt_level="3")  # mypy settings: [tool.mypy] in pyproject.toml
    except (ImportError, SystemExit) as error:
        _say(f"the engine stays pure Python (mypyc could not compile it: {error!r})")
        return []


class OptionalBuildExt(build_ext):
    """Compile the extensions, or leave none at all: a partial set would not import."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # noqa: BLE001 - any compiler failure means "ship pure Python"
            _say(f"the engine stays pure Python (C compilation failed: {error})")
            for path in self.get_outputs():
                if os.path.exists(path):
                    os.remove(path)
            self.extensions = []


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": OptionalBuildExt})

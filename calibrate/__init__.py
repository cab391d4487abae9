"""Calibration: real torch microbenchmarks of this host, fitted into an ``sim`` hardware profile.

This package is the only one that imports torch and NVML. Its modules do
(``calibrate.layers``, ``calibrate.timing`` and the benchmarks); this
``__init__`` does not, so ``require_torch`` can report a missing install in one
line before anything heavy is imported.
"""

from __future__ import annotations

import importlib.util

from sim.errors import MmsimError

INSTALL_HINT = "install with pip install '.[calibrate]' (or -e '.[calibrate]' in a checkout you edit)"


def require_torch() -> None:
    """Raise a one-line user error when the calibration extras (torch, safetensors) are missing."""
    for module in ("torch", "safetensors"):
        if importlib.util.find_spec(module) is None:
            raise MmsimError(f"calibration needs {module}, which is not installed; {INSTALL_HINT}")

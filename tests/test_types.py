"""The code stays type-clean: mypy (configured in pyproject.toml) finds no error in sim or calibrate."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_mypy_finds_no_errors():
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    done = subprocess.run([sys.executable, "-m", "mypy", "sim", "calibrate"], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, f"mypy exited with {done.returncode}:\n{done.stdout}{done.stderr}"

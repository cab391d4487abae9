"""Names the system cannot look up: a path with a component over the file system's 255 bytes (ENAMETOOLONG), given
where a command reads a file or folder, on the command line or in a scenario or sweep file. Each is refused with one
line naming the path, exit 2 and no traceback (Python 3.11's ``Path.exists`` and ``is_file`` raise for such a name
instead of answering no; found by the input fuzzer at ``MMSIM_FUZZ_SCALE=40``), and a path holding a NUL byte."""

from __future__ import annotations

import errno

import pytest
import yaml

from sim.outputs import path_error
from tests.test_bad_input import PROFILE, cli, refused, tiny_scenario, write, write_yaml

LONG = "x" * 300


@pytest.mark.parametrize("args, expected", [
    (["run", "{scenario}", "--profile", LONG], "unknown profile"),
    (["run", "{scenario}", "--profile", LONG + ".json"], "File name too long"),
    (["profiles", "show", LONG + ".json"], "File name too long"),
    (["calibrate", "validate", LONG], "unknown profile"),
    (["calibrate", "interconnect", LONG + ".json"], "is not a profile file"),
    (["report", LONG], "is not a folder"),
    (["report", "{folder}/" + LONG + "/runs"], "is not a folder"),
], ids=["run-profile", "run-profile-json", "profiles-show", "calibrate-validate", "calibrate-interconnect", "report",
        "report-nested"])
def test_a_too_long_name_on_the_command_line_is_refused(tmp_path, args, expected):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    args = [arg.format(scenario=scenario, folder=tmp_path) for arg in args]
    refused(args, expected, out=tmp_path / "out")


@pytest.mark.parametrize("field, value, expected", [
    ("profile", LONG, "unknown profile"),
    ("profile", LONG + ".json", "File name too long"),
    ("workload", {"trace": {"path": LONG + ".csv"}}, "not found"),
], ids=["profile-name", "profile-file", "trace-path"])
def test_a_too_long_name_in_a_scenario_is_refused(tmp_path, field, value, expected):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(**{field: value}))
    refused(["run", scenario, "--out", tmp_path / "out"], "s.yaml", expected, out=tmp_path / "out")


def test_a_too_long_policy_file_and_sweep_base_are_refused(tmp_path):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused(["run", scenario, "--policy", f"{LONG}.py:Mine", "--out", tmp_path / "out"], "does not exist",
            out=tmp_path / "out")
    sweep = write(tmp_path / "sweep.yaml", f"name: s\nbase: {LONG}.yaml\naxes: {{seed: [1, 2]}}\n")
    refused(["sweep", sweep, "--out", tmp_path / "sweep"], "base", "not found", out=tmp_path / "sweep")


def test_a_profile_path_is_still_read_after_the_change(tmp_path):
    """The lookups now answer through ``os.path``: a profile given by a path relative to the scenario still loads."""
    (tmp_path / "p.json").write_text(PROFILE.read_text())
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(profile="p.json"))
    code, text = cli("run", scenario, "--out", tmp_path / "out", "--json")
    assert code == 0, text
    assert (tmp_path / "out" / "summary.json").is_file()


def test_an_os_error_of_an_unusable_path_is_one_line_naming_it():
    """The last line of defence in ``main``: what no check caught still names the path, not a traceback."""
    problem = path_error(OSError(errno.ENAMETOOLONG, "File name too long", LONG))
    assert problem is not None and LONG in str(problem) and "too long" in str(problem)
    assert path_error(OSError(errno.EIO, "I/O error", "f")) is None  # a real fault stays loud
    assert path_error(OSError(errno.ENAMETOOLONG, "File name too long")) is None  # nothing to name


def test_a_nul_byte_in_a_profile_path_is_refused(tmp_path):
    """A YAML ``"\\0"`` escape puts a NUL byte in a path, which no file name holds: Python raises ValueError, not
    OSError, and a profile file's lookup let it through as a traceback."""
    text = yaml.safe_dump(tiny_scenario(profile="PROFILE")).replace("profile: PROFILE", 'profile: "a\\0b.json"')
    scenario = write(tmp_path / "s.yaml", text)
    refused(["run", scenario, "--out", tmp_path / "out"], "s.yaml", "NUL byte", out=tmp_path / "out")

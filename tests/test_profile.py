"""Profile schema: built-ins load, malformed profiles are rejected with a clear message."""

from __future__ import annotations

import json
import subprocess

import pytest

from sim.errors import MmsimError
from sim.profile import builtin_profile_names, load_profile, load_profile_file


def test_builtins_present_and_valid():
    names = builtin_profile_names()
    assert {"paper-rtx5000", "paper-a6000", "a100-80gb", "h100-sxm", "h200"} <= set(names)
    for name in names:
        assert load_profile(name).schema_version == 1


def test_paper_profiles_are_published_or_derived():
    profile = load_profile("paper-rtx5000")
    sources = set(profile.provenance().values())
    assert sources <= {"published", "derived", "estimated"}
    assert profile.models["qwen2.5-14b"].swap.reload_s == 6.70
    assert profile.models["qwen2.5-14b"].swap.source == "published"
    assert "formula" in profile.link.host_to_device.note or "midpoint" in profile.link.host_to_device.note


def test_datacenter_profiles_are_estimated():
    for name in ("a100-80gb", "h100-sxm", "h200"):
        assert load_profile(name).hardware.gpu.source == "estimated"


def _write(tmp_path, data) -> str:
    path = tmp_path / "p.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def _valid() -> dict:
    return load_profile("h100-sxm").model_dump(mode="json")


def test_malformed_json(tmp_path):
    with pytest.raises(MmsimError, match="not valid JSON"):
        load_profile_file(_write(tmp_path, "{nope"))


def test_missing_field(tmp_path):
    data = _valid()
    del data["link"]
    with pytest.raises(MmsimError, match="link"):
        load_profile_file(_write(tmp_path, data))


def test_wrong_schema_version(tmp_path):
    data = _valid() | {"schema_version": 99}
    with pytest.raises(MmsimError, match="schema_version"):
        load_profile_file(_write(tmp_path, data))


def test_negative_bandwidth(tmp_path):
    data = _valid()
    data["link"]["host_to_device"]["bandwidth_bytes_per_s"] = -5
    with pytest.raises(MmsimError, match=r"link\.host_to_device\.bandwidth_bytes_per_s"):
        load_profile_file(_write(tmp_path, data))


def test_unknown_source_tag(tmp_path):
    data = _valid()
    data["weights"]["from_disk"]["source"] = "guessed"
    with pytest.raises(MmsimError, match="from_disk.source"):
        load_profile_file(_write(tmp_path, data))


def test_cli_profiles(tmp_path):
    out = subprocess.run(["mmsim", "profiles", "show", "paper-rtx5000", "--json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["name"] == "paper-rtx5000"
    bad = subprocess.run(["mmsim", "profiles", "show", _write(tmp_path, "[1, 2]")], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr

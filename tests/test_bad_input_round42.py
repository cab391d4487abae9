"""Bad input of round 42: run folders written before a scenario field existed, trace import/merge onto a name
the system refuses, sweep axes through keys that hold dots, and output paths through a link to nothing."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pytest
import yaml

from sim.errors import MmsimError
from sim.reports.comparable import first_difference
from sim.schema import with_defaults
from sim.scenario import load_scenario
from sim.sweep.axis_paths import axis_keys
from sim.sweep.spec import expand, load_sweep
from tests.test_bad_input import ROOT, TRACE_HEADER, cli, refused, tiny_scenario, write, write_yaml

LONG = "x" * 300
"""A path component over every common file system's 255-byte limit."""


# --- 1. an old run folder compares with a new one -----------------------------------------------------------------

def _run(tmp_path: Path, name: str, seed: int) -> Path:
    scenario = tmp_path / "s.yaml"
    if not scenario.exists():
        write_yaml(scenario, tiny_scenario())
    out = tmp_path / name
    code, text = cli("run", scenario, "--seed", seed, "--out", out)
    assert code == 0, text
    return out


def _edit_scenario(run_dir: Path, edit) -> None:
    path = run_dir / "scenario.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def _delete(data: dict, dotted: str) -> None:
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    del node[last]


OLD_FIELDS = ["slo_classes", "engine.prefix_caching", "cold_start.weight_streaming", "autoscaler",
              "models.0.pipeline_parallel", "workload.generator.conversations", "workload.prefix_block_tokens",
              "routing.weights.kv", "cluster.placement", "sample_interval_s", "slo.default.e2e_s"]
"""Fields an older mmsim did not write (slo_classes was the reported one), each with a default now."""


@pytest.mark.parametrize("fields", [["slo_classes"], OLD_FIELDS], ids=["slo_classes", "many"])
def test_a_run_folder_written_before_a_field_existed_compares_with_a_new_one(tmp_path, fields):
    """Was: runs are not comparable: scenario.slo_classes is None in OLD but {} in NEW."""
    old, new = _run(tmp_path, "old", 1), _run(tmp_path, "new", 2)
    _edit_scenario(old, lambda data: [_delete(data, field) for field in fields])
    code, text = cli("report", old, new, "--out", tmp_path / "r.html")
    assert code == 0, text
    assert (tmp_path / "r.html").is_file()


def test_a_run_folder_written_before_a_field_existed_is_the_same_run_again(tmp_path):
    """Was: running the same scenario into a folder an older mmsim wrote needed --force (scenario.json lacked
    slo_classes, so it was taken for another scenario's run), and a sweep could not resume such a folder."""
    old = _run(tmp_path, "old", 1)
    _edit_scenario(old, lambda data: [_delete(data, field) for field in OLD_FIELDS])
    code, text = cli("run", tmp_path / "s.yaml", "--seed", 1, "--out", old)
    assert code == 0, text
    refused(["run", tmp_path / "s.yaml", "--seed", 2, "--out", old], "--force")  # another run's folder still is


def test_calibrate_refuses_an_out_name_the_system_refuses_before_measuring(tmp_path):
    """Was: an OSError traceback (and under a new folder, after the measuring)."""
    for out in (tmp_path / f"{LONG}.json", tmp_path / "new" / f"{LONG}.json"):
        refused(["calibrate", "--device", "cpu", "--quick", "--out", out], "cannot write there (File name too long")
        assert not (tmp_path / "new").exists()


def test_a_real_difference_is_still_refused_and_an_absent_field_named_as_such(tmp_path):
    old, new = _run(tmp_path, "old", 1), _run(tmp_path, "new", 2)
    _edit_scenario(old, lambda data: _delete(data, "engine.prefix_caching"))
    _edit_scenario(new, lambda data: data["engine"].update(prefix_caching=False))  # not the default: a difference
    refused(["report", old, new, "--out", tmp_path / "r.html"], "scenario.engine.prefix_caching is True in",
            "but False in", out=tmp_path / "r.html")
    _edit_scenario(new, lambda data: data["engine"].update(prefix_caching=True))
    _edit_scenario(old, lambda data: data.update(retired_field=3))  # a field this mmsim does not know
    refused(["report", old, new, "--out", tmp_path / "r.html"], "scenario.retired_field is 3 in", "but absent in",
            out=tmp_path / "r.html")
    _edit_scenario(old, lambda data: (data.pop("retired_field"), data.update(slo_classes={"gold": {"ttft_s": 1.0}})))
    refused(["report", old, new, "--out", tmp_path / "r.html"], "scenario.slo_classes.gold is", "but absent in",
            out=tmp_path / "r.html")


def _paths(node, prefix=()):
    """Every key path of a scenario dump, as tuples of keys (a model name such as qwen2.5-3b holds a dot)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


@pytest.mark.parametrize("scenario", sorted(glob.glob(str(ROOT / "scenarios" / "*.yaml")))[:10],
                         ids=lambda path: Path(path).stem)
def test_every_defaulted_field_left_out_reads_as_its_default(scenario):
    """Generally, not only slo_classes: leaving out any one field of a shipped scenario's dump either restores it
    (it had its default) or differs at that field alone; nothing else moves."""
    try:
        dump = load_scenario(scenario).model_dump(mode="json")
    except MmsimError:
        pytest.skip("not a scenario (a sweep file)")
    assert with_defaults(dump) == dump
    restored = 0
    for keys in _paths(dump):
        if isinstance(keys[-1], int):
            continue  # a list item is not a field
        data = json.loads(json.dumps(dump))
        node = data
        for key in keys[:-1]:
            node = node[key]
        left_out = node.pop(keys[-1])
        found = first_difference(with_defaults(data), dump)
        restored += found is None and left_out is not None  # an absent None read as None before
        path = ".".join(map(str, keys))
        assert found is None or found[0] == path or found[0].startswith(path + "."), (path, found)
    assert restored >= 30, restored


# --- 2. trace import / merge onto a name the system refuses -------------------------------------------------------

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"


@pytest.mark.parametrize("command", ["import", "merge"])
@pytest.mark.parametrize("where", ["long-name", "under-loop"])
def test_trace_import_and_merge_refuse_an_out_the_system_refuses_before_work(tmp_path, command, where):
    """Was an OSError traceback from check_not_an_input's exists(), before the output check ran."""
    write(tmp_path / "az.csv", AZURE)
    write(tmp_path / "t.csv", TRACE_HEADER + "0.1,qwen2.5-3b,100,20\n")
    (tmp_path / "loop-a").symlink_to("loop-b")
    (tmp_path / "loop-b").symlink_to("loop-a")
    out = {"long-name": f"{LONG}.csv", "under-loop": "loop-a/x.csv"}[where]
    reason = {"long-name": "cannot write there (File name too long)",
              "under-loop": "cannot write there (Too many levels of symbolic links)"}[where]
    args = (["trace", "import", "azure-2023", "az.csv", out, "--model", "qwen3-8b"] if command == "import"
            else ["trace", "merge", "t.csv", out])
    refused(args, reason, cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["az.csv", "loop-a", "loop-b", "t.csv"]


# --- 3. sweep axes through keys that hold dots --------------------------------------------------------------------

DOTTED = tiny_scenario(slo={"default": {"ttft_s": 2.0}}, slo_classes={"gold.v2": {"ttft_s": 1.0}})


def _expand(tmp_path: Path, axes: dict, base: dict = DOTTED):
    write_yaml(tmp_path / "base.yaml", base)
    path = write_yaml(tmp_path / "sweep.yaml", {"name": "d", "base": "base.yaml", "axes": axes})
    return expand(load_sweep(path), path)


@pytest.mark.parametrize("axis, where", [
    ("slo.qwen2.5-3b.ttft_s", ("slo", "qwen2.5-3b", "ttft_s")),  # a new key: ttft_s is an SLO field, 5-3b is not
    ('slo."qwen2.5-3b".ttft_s', ("slo", "qwen2.5-3b", "ttft_s")),  # quoted
    ("workload.generator.mix.qwen2.5-3b", ("workload", "generator", "mix", "qwen2.5-3b")),  # a key the base has
    ("slo_classes.gold.v2.ttft_s", ("slo_classes", "gold.v2", "ttft_s")),
    ('slo_classes."gold.v2".tpot_s', ("slo_classes", "gold.v2", "tpot_s")),
    ("slo_classes.silver.v1.ttft_s", ("slo_classes", "silver.v1", "ttft_s")),  # a new class
    ("slo.default.ttft_s", ("slo", "default", "ttft_s")),  # old spellings as before
    ("models.0.dtype", ("models", "0", "dtype")),
    ("policy.params.a.b", ("policy", "params", "a", "b")),  # a free mapping: each dot splits, as before
])
def test_an_axis_reaches_a_key_that_holds_dots(tmp_path, axis, where):
    value = {"models.0.dtype": "fp16", "policy.params.a.b": 1}.get(axis, 0.5)
    data = json.loads(json.dumps(DOTTED))
    assert axis_keys(axis, data) == where
    if axis.startswith("policy.params"):
        return  # static takes no parameters: the run would be refused for that, not for the path
    [task] = _expand(tmp_path, {axis: [value]})
    node = task.scenario_data
    for key in where:
        node = node[int(key)] if isinstance(node, list) else node[key]
    assert node == value
    assert "qwen2" not in task.scenario_data["slo"] and "silver" not in task.scenario_data.get("slo_classes", {})


def test_a_new_dotted_key_at_the_end_of_an_axis_is_quoted(tmp_path):
    [task] = _expand(tmp_path, {'slo_classes."silver.v1"': [{"ttft_s": 3.0}]})
    assert task.scenario_data["slo_classes"]["silver.v1"] == {"ttft_s": 3.0}


@pytest.mark.parametrize("axis, expected", [
    ("slo.qwen2.5-3b.tft_s", "there is no field 'tft_s' under slo.\"qwen2.5-3b\""),  # was a pydantic error per run
    ("slo_classes.silver.v1", "there is no field 'v1' under slo_classes.silver"),  # quote a new key at the end
    ("workload.generator.arrivals.rate", "there is no field 'rate' under workload.generator.arrivals"),
    ("models.3.dtype", "models is a list of 1 in the base"),
    ("cluster.pools.0.nodes", "cluster.pools is not a list in the base"),  # was a pydantic error per run
])
def test_an_axis_that_names_nothing_says_where_it_stops(tmp_path, axis, expected):
    with pytest.raises(MmsimError, match="axis .* is not a field of the base scenario base.yaml") as error:
        _expand(tmp_path, {axis: [1.0]})
    assert expected in str(error.value) and f"axes.{axis}" in str(error.value)
    if "." in axis.split(".", 1)[1] and axis.startswith("slo"):
        assert 'quoted, e.g. slo."qwen2.5-3b".ttft_s' in str(error.value)


@pytest.mark.parametrize("axis, expected", [
    ('slo."qwen2.5-3b.ttft_s', "opens a quote it does not close"),
    ('slo."a"b', "a quoted key must be followed by a dot"),
    ("slo..ttft_s", "has an empty key"),
    ("slo.default.", "has an empty key"),
    ("slo.de\"fault.ttft_s", "a quote must enclose a whole key"),
    ("a." * 70 + "b", "more than 64 keys"),
])
def test_a_misspelt_axis_is_refused_when_the_sweep_is_read(tmp_path, axis, expected):
    path = write_yaml(tmp_path / "sweep.yaml", {"name": "d", "base": "base.yaml", "axes": {axis: [1.0]}})
    with pytest.raises(MmsimError, match=expected):
        load_sweep(path)


def test_two_spellings_of_one_key_are_one_field(tmp_path):
    with pytest.raises(MmsimError, match="both set slo.\"qwen2.5-3b\".ttft_s"):
        _expand(tmp_path, {'slo."qwen2.5-3b".ttft_s': [1.0], "slo.qwen2.5-3b.ttft_s": [2.0]})


def test_mmsim_sweep_refuses_an_axis_that_names_nothing_in_one_line(tmp_path):
    write_yaml(tmp_path / "base.yaml", DOTTED)
    sweep = write_yaml(tmp_path / "sweep.yaml", {"name": "d", "base": "base.yaml",
                                                "axes": {"slo.qwen2.5-3b.tft_s": [1.0]}})
    refused(["sweep", sweep, "--out", tmp_path / "out", "--workers", "1"], "there is no field 'tft_s'",
            out=tmp_path / "out")


# --- 4. an output path through a symbolic link to nothing ---------------------------------------------------------

def _commands(tmp_path: Path, out: str) -> dict[str, list]:
    write_yaml(tmp_path / "s.yaml", tiny_scenario())
    write_yaml(tmp_path / "sw.yaml", {"name": "sw", "base": "s.yaml", "axes": {"seed": [1, 2]}})
    write(tmp_path / "t.csv", TRACE_HEADER + "0.1,qwen2.5-3b,100,20\n")
    return {"run": ["run", "s.yaml", "--out", out],
            "sweep": ["sweep", "sw.yaml", "--out", out, "--workers", "1"],
            "compare": ["compare", "s.yaml", "--policies", "static", "--runs-dir", out, "--out", "c.html"],
            "compare-page": ["compare", "s.yaml", "--policies", "static", "--out", f"{out}/c.html"],
            "capacity": ["capacity", "s.yaml", "--policies", "static", "--out", out, "--low", "0.5", "--high", "1",
                         "--tolerance", "0.5"],
            "trace-generate": ["trace", "generate", "--out", f"{out}/g.csv", "--duration", "2", "--rate", "1",
                               "--mix", "qwen2.5-3b=1"],
            "trace-merge": ["trace", "merge", "t.csv", f"{out}/m.csv"],
            "calibrate": ["calibrate", "--device", "cpu", "--quick", "--out", "c.json", "--workdir", out]}


@pytest.mark.parametrize("where", ["the-out", "above-the-out"])
@pytest.mark.parametrize("command", ["run", "sweep", "compare", "compare-page", "capacity", "trace-generate",
                                     "trace-merge", "calibrate"])
def test_an_out_through_a_link_to_nothing_is_refused_before_work(tmp_path, command, where):
    """Was a FileExistsError traceback from mkdir after the work (a sweep, compare or capacity even with the link
    as --out itself; a run under it); a link to a missing folder is most often one to a disk not mounted."""
    (tmp_path / "gone").symlink_to("missing/folder")
    out = {"the-out": "gone", "above-the-out": "gone/run"}[where]
    if where == "the-out" and command in ("compare-page", "trace-generate", "trace-merge"):
        out = "gone"  # their output is a file below it: the link is a folder above
    args = _commands(tmp_path, out)[command]
    refused(args, "gone is a symbolic link to missing/folder, which does not exist", cwd=tmp_path)
    assert not (tmp_path / "missing").exists(), "the folder the link names was made"
    assert not list(tmp_path.glob("reports")) and not list(tmp_path.glob("*.html")), "work was done"


def test_a_file_output_that_is_a_link_to_nothing_is_still_written_through(tmp_path):
    """A file (not a folder) named by a link to nothing yet is created where the link points, as a shell's
    ``>`` does; the link stays."""
    (tmp_path / "g.csv").symlink_to("real.csv")
    code, text = cli("trace", "generate", "--out", tmp_path / "g.csv", "--duration", "2", "--rate", "1",
                     "--mix", "qwen2.5-3b=1")
    assert code == 0, text
    assert (tmp_path / "g.csv").is_symlink() and (tmp_path / "real.csv").is_file()


def test_a_link_to_an_existing_folder_is_still_followed(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to("target")
    write_yaml(tmp_path / "s.yaml", tiny_scenario())
    code, text = cli("run", tmp_path / "s.yaml", "--out", tmp_path / "link" / "run")
    assert code == 0, text
    assert (tmp_path / "target" / "run" / "summary.json").is_file()
    assert os.path.islink(tmp_path / "link")


@pytest.mark.parametrize("command", ["run", "compare"])
def test_a_deployment_whose_cpu_layers_fit_no_node_is_named_in_its_file(tmp_path, command):
    """compare named only the field (run named the file too): the check is made as the run builds the cluster."""
    scenario = tmp_path / "offloaded.yaml"
    data = tiny_scenario(models=[{"name": "llama-2-70b", "gpu_share": 0.1}],
                         cluster={"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 1})
    data["workload"]["generator"]["mix"] = {"llama-2-70b": 1.0}
    write_yaml(scenario, data)
    extra = ["--policies", "static", "--runs-dir", tmp_path / "runs"] if command == "compare" else []
    out = tmp_path / ("r.html" if command == "compare" else "out")
    refused([command, scenario, *extra, "--out", out], f"{scenario}: models.llama-2-70b.gpu_share: gpu_share 0.1",
            out=out)

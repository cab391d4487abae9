"""Bad input of round 41: an import onto its own input, long names under new folders, YAML 1.1 scalars, huge
--threads, odd model names and keys in trace generate, --model relabelling several models, and runs of no request.

Each case runs ``mmsim`` as a subprocess (the segmentation fault of --threads would take the test process down).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_bad_input import ROOT, TRACE_HEADER, assert_refused, tiny_scenario, write, write_yaml

LONG = "x" * 300
"""A path component over every common file system's 255-byte limit."""


def mmsim(*args, cwd: Path) -> tuple[int, str]:
    """Run ``mmsim ARGS`` in a subprocess; (exit code, stdout + stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "sim.cli", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def refused(args, *expected: str, cwd: Path) -> str:
    """Assert exit 2, one ``error:`` line holding each of ``expected``, no traceback."""
    code, text = mmsim(*args, cwd=cwd)
    assert_refused(code, text, expected)
    return text


AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
TWO_MODELS = TRACE_HEADER + "0.1,qwen2.5-3b,100,20\n0.2,qwen3-8b,200,30\n"


# --- 1. trace import onto its own input ---------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["same", "link", "dotted"])
def test_trace_import_refuses_out_that_is_its_input(tmp_path, spelling):
    source = write(tmp_path / "az.csv", AZURE)
    (tmp_path / "link.csv").symlink_to("az.csv")
    out = {"same": "az.csv", "link": "link.csv", "dotted": f"../{tmp_path.name}/az.csv"}[spelling]
    refused(["trace", "import", "azure-2023", "az.csv", out, "--model", "qwen3-8b"], "OUT is the trace IN", cwd=tmp_path)
    assert source.read_text() == AZURE


def test_trace_merge_still_refuses_out_that_is_an_input(tmp_path):
    write(tmp_path / "t.csv", TWO_MODELS)
    refused(["trace", "merge", "t.csv", "t.csv"], "OUT is also an input", cwd=tmp_path)
    assert (tmp_path / "t.csv").read_text() == TWO_MODELS


# --- 2. a name over 255 bytes under a folder that does not exist yet ----------------------------------------------

@pytest.mark.parametrize("command", ["run", "sweep", "compare", "capacity", "calibrate", "trace-generate"])
def test_a_long_name_under_a_new_folder_is_refused_before_work(tmp_path, command):
    write_yaml(tmp_path / "s.yaml", tiny_scenario())
    write_yaml(tmp_path / "sw.yaml", {"name": "sw", "base": "s.yaml", "axes": {"seed": [1, 2]}})
    args = {"run": ["run", "s.yaml", "--out", f"new/{LONG}/b"],
            "sweep": ["sweep", "sw.yaml", "--out", f"new/{LONG}/x"],
            "compare": ["compare", "s.yaml", "--policies", "static", "--runs-dir", f"new/{LONG}/x"],
            "capacity": ["capacity", "s.yaml", "--out", f"new/{LONG}/x"],
            "calibrate": ["calibrate", "--device", "cpu", "--quick", "--out", "c.json", "--workdir", f"new/{LONG}/x"],
            "trace-generate": ["trace", "generate", "--out", f"new/{LONG}/g.csv", "--duration", "2", "--rate", "1",
                               "--mix", "qwen3-8b=1"]}[command]
    refused(args, "File name too long", "300 bytes", cwd=tmp_path)
    assert not (tmp_path / "new").exists(), "a folder was made before the run"


def test_a_long_multibyte_name_counts_bytes_not_characters(tmp_path):
    write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused(["run", "s.yaml", "--out", f"new/{'é' * 130}/b"], "260 bytes", cwd=tmp_path)  # 130 characters, 260 bytes


# --- 3. YAML 1.2 core schema ----------------------------------------------------------------------------------------

def _scenario_with(tmp_path: Path, field: str, text: str) -> Path:
    """tiny_scenario's YAML with one scalar written as ``text`` (as a person would type it, unquoted)."""
    data = tiny_scenario()
    data.setdefault("engine", {})
    body = yaml.safe_dump(data, sort_keys=False)
    marker = {"rate_per_s": "rate_per_s: 2.0", "duration_s": "duration_s: 3"}.get(field)
    if marker:
        body = body.replace(marker, f"{field}: {text}")
    else:
        body = body.replace("engine: {}", f"engine:\n  {field}: {text}")
    return write(tmp_path / "s.yaml", body)


@pytest.mark.parametrize("field, text, expected", [
    ("rate_per_s", "10:30", "rate_per_s: Input should be a valid number"),  # YAML 1.1: the number 630
    ("rate_per_s", "1_000", "rate_per_s: Input should be a valid number"),  # YAML 1.1: a thousand
    ("chunked_prefill", "yes", "engine.chunked_prefill: Input should be a valid boolean"),
    ("chunked_prefill", "on", "engine.chunked_prefill: Input should be a valid boolean"),
    ("chunked_prefill", "no", "engine.chunked_prefill: Input should be a valid boolean"),
    ("chunked_prefill", "off", "engine.chunked_prefill: Input should be a valid boolean"),
])
def test_yaml_1_1_scalars_are_text_and_refused_naming_the_field(tmp_path, field, text, expected):
    _scenario_with(tmp_path, field, text)
    refused(["run", "s.yaml", "--out", "o"], expected, cwd=tmp_path)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text, value", [
    ("1e-6", 1e-6), ("2E3", 2000.0), (".5", 0.5), ("5.", 5.0), ("+5", 5), ("010", 10), ("0o17", 15), ("0x1F", 31),
    ("true", True), ("True", True), ("TRUE", True), ("false", False), ("null", None), ("~", None), ("", None),
    ("10:30", "10:30"), ("1_000", "1_000"), ("yes", "yes"), ("off", "off"), ("tRue", "tRue"), ("2020-01-01", "2020-01-01"),
    ("0b101", "0b101"),
])
@pytest.mark.parametrize("python_loader", [False, True])
def test_plain_scalars_follow_the_yaml_1_2_core_schema(text, value, python_loader):
    from sim.files import LIBYAML_MAX_MARKS, parse_yaml

    padding = "\n# " + "-" * (LIBYAML_MAX_MARKS + 1) if python_loader else ""  # many marks: the Python loader
    assert parse_yaml(f"a: {text}{padding}", "x") == {"a": value}


def test_special_floats_and_merge_keys():
    import math

    from sim.files import parse_yaml

    data = parse_yaml("a: .inf\nb: -.Inf\nc: .NaN\nbase: &b {x: 1}\nd: {<<: *b, y: 2}\n", "x")
    assert data["a"] == math.inf and data["b"] == -math.inf and math.isnan(data["c"])
    assert data["d"] == {"x": 1, "y": 2}


@pytest.mark.parametrize("text, expected", [("!!int yes", "'yes' is not a whole number"),
                                            ("!!float abc", "'abc' is not a number"),
                                            ("!!bool maybe", "'maybe' is not true or false"),
                                            ("9" * 5000, "too long")])
def test_explicit_tags_and_huge_integers_are_yaml_errors(text, expected):
    from sim.errors import MmsimError
    from sim.files import parse_yaml

    with pytest.raises(MmsimError, match=expected):
        parse_yaml(f"a: {text}", "x")


def test_shipped_scenarios_and_yaml_files_load_as_pyyaml_1_1_read_them():
    """Every shipped YAML file reads the same as under PyYAML's own resolvers: none uses a 1.1-only scalar."""
    from sim.files import load_yaml

    files = [*glob.glob(str(ROOT / "scenarios" / "*.yaml")), *glob.glob(str(ROOT / "sim" / "data" / "*.yaml"))]
    assert files
    for path in files:
        assert load_yaml(Path(path)) == yaml.safe_load(Path(path).read_text()), path


# --- 4. calibrate --threads -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["calibrate", "--device", "cpu", "--threads", "100000", "--quick", "--out", "x.json"],
                                  ["calibrate", "validate", "paper-rtx5000", "--threads", "100000"]])
def test_calibrate_threads_are_bounded(tmp_path, args):
    refused(args, "--threads 100,000 is more than this machine can use: give 1 to", cwd=tmp_path)
    assert not (tmp_path / "x.json").exists()


# --- 5. trace generate flags and files, trace stats, the CSV reader -----------------------------------------------

GENERATE = ["trace", "generate", "--out", "g.csv", "--duration", "2", "--rate", "1"]


@pytest.mark.parametrize("flags, expected", [
    (["--mix", "qw\nen=1"], "--mix: model name 'qw\\nen' holds a control character"),
    (["--zipf", "1", "--models", "a,b\tc"], "--models: model name 'b\\tc' holds a control character"),
    (["--mix", "a=1", "--prompt", "constant,valu=5"], "--prompt: constant has no key 'valu' (e.g. constant,value=512)"),
    (["--mix", "a=1", "--prompt", "constant"], "--prompt constant needs value=..."),
    (["--mix", "a=1", "--output", "uniform,low=3"], "--output uniform needs high=..."),
    (["--models", "a,b"], "--zipf S and --models a,b,c go together"),
    (["--zipf", "1"], "--zipf S and --models a,b,c go together"),
    (["--mix", "cv=-1"], "--mix: expected a share >= 0"),
])
def test_trace_generate_flag_problems_name_the_flag_and_key(tmp_path, flags, expected):
    refused([*GENERATE, *flags], expected, cwd=tmp_path)
    assert not (tmp_path / "g.csv").exists()


def test_trace_generate_config_with_no_generator_key_names_the_file_and_key(tmp_path):
    write(tmp_path / "junk.yaml", "foo: 1\n")
    refused(["trace", "generate", "--out", "g.csv", "--config", "junk.yaml"], "junk.yaml: 'foo' is not a generator field",
            cwd=tmp_path)
    write_yaml(tmp_path / "s.yaml", {**tiny_scenario(), "workload": {"generator": {**tiny_scenario()["workload"]["generator"],
                                                                                   "bogus": 1}}})
    refused(["trace", "generate", "--out", "g.csv", "--config", "s.yaml"], "s.yaml: workload.generator: 'bogus'",
            cwd=tmp_path)


def test_trace_generate_config_still_generates(tmp_path):
    write_yaml(tmp_path / "s.yaml", tiny_scenario())
    code, text = mmsim("trace", "generate", "--out", "g.csv", "--config", "s.yaml", cwd=tmp_path)
    assert code == 0 and "wrote g.csv" in text, text


def test_a_negative_empirical_length_is_shown_as_a_number(tmp_path):
    write(tmp_path / "lp.csv", "num_prefill_tokens,num_decode_tokens\n-5,20\n3,4\n")
    text = refused([*GENERATE, "--mix", "a=1", "--prompt", "empirical,path=lp.csv"],
                   "line 2: num_prefill_tokens -5 is not a whole number >= 0", cwd=tmp_path)
    assert "np." not in text


def test_trace_stats_of_an_empty_trace_says_no_requests(tmp_path):
    write(tmp_path / "e.csv", TRACE_HEADER)
    code, text = mmsim("trace", "stats", "e.csv", "--plot", "e.png", cwd=tmp_path)
    assert code == 0, text
    assert "e.csv: no requests (0 requests from 0 rows); no plot drawn" in text and "None" not in text
    assert not (tmp_path / "e.png").exists()


def test_a_quoted_field_spanning_lines_is_said_to_be_unsupported(tmp_path):
    write(tmp_path / "m.csv", TRACE_HEADER + '0.1,"qw\nen",3,4\n')
    refused(["trace", "stats", "m.csv"], "line 2", "never closed", "a quoted field spanning lines", "is not supported", cwd=tmp_path)


# --- 6. --model / model: on a trace naming several models -----------------------------------------------------------

def test_trace_import_model_refuses_a_trace_of_several_models(tmp_path):
    write(tmp_path / "t.csv", TWO_MODELS)
    refused(["trace", "import", "mmsim", "t.csv", "o.csv", "--model", "qwen3-8b"],
            "t.csv: line 3: model 'qwen3-8b' is a second model", "model map", cwd=tmp_path)
    assert not (tmp_path / "o.csv").exists()


def test_a_scenario_model_refuses_a_trace_of_several_models(tmp_path):
    write(tmp_path / "t.csv", TWO_MODELS)
    scenario = tiny_scenario(models=[{"name": "qwen2.5-3b"}, {"name": "qwen3-8b"}])
    scenario["cluster"]["gpus_per_node"] = 2
    scenario["workload"] = {"trace": {"path": "t.csv", "model": "qwen3-8b"}}
    write_yaml(tmp_path / "s.yaml", scenario)
    refused(["run", "s.yaml", "--out", "o"], "is a second model", cwd=tmp_path)
    assert not (tmp_path / "o").exists()


def test_trace_import_model_relabels_a_trace_of_one_model(tmp_path):
    write(tmp_path / "t.csv", TRACE_HEADER + "0.1,old-name,100,20\n0.2,old-name,200,30\n")
    code, text = mmsim("trace", "import", "mmsim", "t.csv", "o.csv", "--model", "qwen3-8b", cwd=tmp_path)
    assert code == 0, text
    assert (tmp_path / "o.csv").read_text().count("qwen3-8b") == 2


# --- 7. runs of no request ------------------------------------------------------------------------------------------

def _trace_scenario(tmp_path: Path, trace: dict) -> Path:
    scenario = tiny_scenario()
    scenario["workload"] = {"trace": trace}
    return write_yaml(tmp_path / "s.yaml", scenario)


@pytest.mark.parametrize("case, reason", [
    ("header-only", "the trace file holds no rows"),
    ("start-past-end", "none of the trace's 2 rows falls in the window"),
    ("windows-outside", "its arrivals start none within duration_s"),
    ("windows-at-zero", "its arrivals start none within duration_s"),
])
def test_a_run_of_no_request_warns(tmp_path, case, reason):
    if case in ("header-only", "start-past-end"):
        write(tmp_path / "t.csv", TRACE_HEADER + ("" if case == "header-only" else
                                                  "0.1,qwen2.5-3b,100,20\n0.2,qwen2.5-3b,200,30\n"))
        _trace_scenario(tmp_path, {"path": "t.csv", **({"start_s": 100} if case == "start-past-end" else {})})
    else:
        windows = [[20, 1], [30, 2]] if case == "windows-outside" else [[0, 0], [1, 0]]
        scenario = tiny_scenario()
        scenario["workload"]["generator"]["arrivals"] = {"process": "rate-series", "windows": windows}
        write_yaml(tmp_path / "s.yaml", scenario)
    code, text = mmsim("run", "s.yaml", "--out", "o", cwd=tmp_path)
    assert code == 0, text
    assert "warning: the workload gave no requests" in text and reason in text, text


def test_a_run_of_an_empty_parquet_trace_warns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"arrival_s": pa.array([], pa.float64()), "model": pa.array([], pa.string()),
                      "prompt_tokens": pa.array([], pa.int64()), "output_tokens": pa.array([], pa.int64())})
    pq.write_table(table, tmp_path / "t.parquet")
    _trace_scenario(tmp_path, {"path": "t.parquet"})
    code, text = mmsim("run", "s.yaml", "--out", "o", cwd=tmp_path)
    assert code == 0, text
    assert "warning: the workload gave no requests" in text and "holds no rows" in text, text


def test_a_run_with_requests_gives_no_such_warning(tmp_path):
    write_yaml(tmp_path / "s.yaml", tiny_scenario())
    code, text = mmsim("run", "s.yaml", "--out", "o", cwd=tmp_path)
    assert code == 0, text
    assert "gave no requests" not in text

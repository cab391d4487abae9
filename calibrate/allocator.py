"""The memory allocator a CPU vLLM engine runs with: tcmalloc, preloaded, as vLLM's CPU build asks at start-up.

With glibc's malloc, vLLM's CPU engine's steps fault their working memory in again, page by page, run after run
(which layer hands it back to the system was not found; tcmalloc keeps it). On this project's 2-core VM one
1,000-token prefill met 0 to 4,500 page faults (about 13 us each), so the same step ran in 117-195 ms from one run
to the next, and a new process (a validation) ran its probes 8-34% slower than the calibration minutes before it.
With tcmalloc preloaded the memory is kept: the same steps ran in 117-128 ms without a fault. ``LD_PRELOAD`` is read
when a process starts, so a command that finds tcmalloc missing from it starts itself again with it.
"""

from __future__ import annotations

import ctypes.util
import os
import sys

from rich.console import Console

TCMALLOC_NAMES = ("tcmalloc_minimal", "tcmalloc")
RESTARTED = "MMSIM_TCMALLOC_RESTARTED"
"""Set in the environment of the restarted process, so that it never restarts again."""
INSTALL_HINT = "apt-get install libtcmalloc-minimal4 (Debian, Ubuntu) or your system's gperftools package"


def allocator() -> str:
    """``tcmalloc`` when this process was started with it preloaded, else ``glibc``."""
    return "tcmalloc" if any("tcmalloc" in part for part in os.environ.get("LD_PRELOAD", "").split()) else "glibc"


def find_tcmalloc() -> str | None:
    """The name of an installed tcmalloc library, as the dynamic loader finds it, or None."""
    for name in TCMALLOC_NAMES:
        found = ctypes.util.find_library(name)
        if found:
            return found
    return None


def ensure_tcmalloc(may_restart: bool) -> str:
    """The allocator a CPU engine started now would run with, after restarting this process with tcmalloc
    preloaded where that is possible and allowed (``may_restart``: the process runs its own command line, so that
    starting it again repeats the command). Where it is not, says why in one line and returns ``glibc``."""
    if allocator() == "tcmalloc" or not sys.platform.startswith("linux"):  # vLLM's CPU build is for Linux
        return allocator()
    library = find_tcmalloc()
    warn = Console(stderr=True).print
    if library is None:
        warn(f"warning: tcmalloc is not installed, so vLLM's CPU engine runs on glibc's malloc and its steps vary "
             f"by up to 65% with page faults; install it: {INSTALL_HINT}", highlight=False)
        return "glibc"
    if not may_restart or os.environ.get(RESTARTED):
        warn(f"warning: vLLM's CPU engine runs on glibc's malloc here (its steps vary by up to 65% with page faults); "
             f"start the command with LD_PRELOAD={library}", highlight=False)
        return "glibc"
    warn(f"starting again with LD_PRELOAD={library}: vLLM's CPU engine wants tcmalloc", highlight=False)
    os.environ["LD_PRELOAD"] = " ".join(filter(None, (library, os.environ.get("LD_PRELOAD"))))
    os.environ[RESTARTED] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)

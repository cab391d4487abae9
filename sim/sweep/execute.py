"""Running sweep tasks: on a local process pool (default) or on Ray, with resume and a progress bar.

Every run is independent and deterministic given its scenario, so the pool and
Ray produce the same files. Pool workers write their own run folder (same
filesystem); Ray tasks send their results back and the driver writes them, so
a remote cluster needs no shared filesystem. Run folders are written whole or
not at all (sim.runner.write_run_folder); pool workers exit when the driver
dies, and temporaries a killed sweep left are removed when it resumes.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import socket
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from sim.errors import MmsimError
from sim.files import cut
from sim.progress_bar import progress_bar
from sim.results import atomic_write
from sim.sweep.index import make_row, write_index
from sim.sweep.spec import RunTask

RAY_HINT = "--ray needs Ray, an optional extra: pip install -e '.[cluster]' (or pip install 'ray>=2.9')"


def simulate_task(task: RunTask, out_dir: str | None = None, return_frames: bool = False) -> dict:
    """Run one task; write its folder when ``out_dir`` is given. Never raises: failures come back as data."""
    from sim.runner import write_run_folder
    from sim.scenario import parse_scenario
    from sim.simulation import simulate

    started = time.perf_counter()
    outcome: dict[str, Any] = {"run_id": task.run_id, "status": "ok", "error": "", "details": "", "summary": None,
                               "result": None}
    if _interrupted.is_set():  # a task the pool had queued before Ctrl-C: the sweep is stopping, start nothing
        outcome.update(status="interrupted", wall_s=0.0)
        return outcome
    try:
        scenario = parse_scenario(task.scenario_data, f"run {task.run_id}", Path(task.base_dir))
        result = simulate(scenario, base_dir=Path(task.base_dir))
        outcome["summary"] = result.summary
        if out_dir is not None:
            write_run_folder(result, Path(out_dir), task.scenario_data)
        elif return_frames:
            outcome["result"] = result
    except Exception as error:  # a run's failure is recorded in the index; the sweep goes on
        # An input error (a profile an axis names that does not exist) is its one line; only a defect keeps a traceback.
        details = f"{error}\n" if isinstance(error, MmsimError) else traceback.format_exc()
        outcome.update(status="failed", error=f"{type(error).__name__}: {error}", details=details)
        if out_dir is not None:
            write_error(Path(out_dir), outcome["details"])
    outcome["wall_s"] = time.perf_counter() - started
    return outcome


def write_error(run_dir: Path, text: str) -> None:
    """Keep a failed run's traceback in its folder; a full disk only loses the file (the index has the error)."""
    with contextlib.suppress(OSError):
        atomic_write(run_dir / "error.txt", lambda p: Path(p).write_text(text))


_interrupted = threading.Event()
"""Set in a pool worker by the first Ctrl-C (SIGINT): its run stops, and the tasks queued to it start nothing."""


def _on_interrupt(signum: int, frame: object) -> None:
    if not _interrupted.is_set():  # only the first: a second would cut short the run's clean-up of its temporaries
        _interrupted.set()
        raise KeyboardInterrupt


def start_worker(parent_pid: int) -> None:
    """Pool worker initializer: exit with the driver, and stop at Ctrl-C without starting the tasks queued to it
    (a worker carries on after a task's KeyboardInterrupt, and took the next: a sweep interrupted at its second run
    of six ran four more before it exited)."""
    exit_with_parent(parent_pid)
    signal.signal(signal.SIGINT, _on_interrupt)


def exit_with_parent(parent_pid: int) -> None:
    """Pool worker initializer: end this worker once the driver is gone (``kill -9`` leaves no cleanup)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="mmsim-parent-watch", daemon=True).start()


def check_ray_address(address: str, timeout_s: float = 10.0) -> None:
    """Fail fast, naming the address, when nothing listens there (Ray itself retries for minutes)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise MmsimError(f"--ray-address {address!r} is not HOST:PORT (or ray://HOST:PORT, or auto)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as error:
        raise MmsimError(f"cannot reach a Ray cluster at {address} ({getattr(error, 'strerror', None) or error}); "
                         "is the head node running (ray start --head) and the port right?") from None


class Backend:
    """Where runs execute: a local process pool, or Ray (a local cluster started here, or one at an address).

    A context manager, so that several batches (capacity search steps) share one pool or one Ray session.
    """

    def __init__(self, workers: int | None = None, use_ray: bool = False, ray_address: str | None = None):
        self.workers = workers or os.cpu_count() or 1
        self.use_ray = use_ray or bool(ray_address)
        self.ray_address = ray_address
        self._pool: ProcessPoolExecutor | None = None
        self._ray: ModuleType | None = None
        self._ray_started_here = False

    def __enter__(self) -> "Backend":
        if not self.use_ray:
            # spawn, not fork: the driver runs a progress-bar thread, and forking a threaded process is unsafe.
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=start_worker, initargs=(os.getpid(),))
            return self
        try:
            import ray
        except ImportError:
            raise MmsimError(RAY_HINT) from None
        self._ray = ray
        if not ray.is_initialized():
            if self.ray_address:
                check_ray_address(self.ray_address)
            options = {"address": self.ray_address} if self.ray_address else {"num_cpus": self.workers, "include_dashboard": False}
            try:
                ray.init(log_to_driver=False, **options)
            except (ConnectionError, TimeoutError, RuntimeError) as error:
                where = f"at {self.ray_address}" if self.ray_address else "locally"
                raise MmsimError(f"cannot start or join Ray {where}: {cut(error, 300)}") from None
            self._ray_started_here = True
        return self

    def __exit__(self, kind, *exc) -> None:
        if self._pool is not None:
            if kind is not None and issubclass(kind, KeyboardInterrupt):
                # Ctrl-C reaches the workers with the driver from a terminal; ``kill -INT`` of the driver alone
                # does not: pass it on, so that shutting down waits for no run.
                for process in list(self._pool._processes.values()):  # type: ignore[union-attr]
                    if process.pid is not None:
                        with contextlib.suppress(OSError):
                            os.kill(process.pid, signal.SIGINT)
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._ray_started_here and self._ray is not None:
            self._ray.shutdown()

    def map(self, tasks: list[RunTask], out: Path | None = None) -> Iterator[dict]:
        """Outcomes of ``tasks`` as they finish. With ``out`` each run lands in OUT/<run_id>/."""
        if self._ray is not None:
            yield from self._ray_map(self._ray, tasks, out)
            return
        assert self._pool is not None  # __enter__ starts the pool when Ray is not used
        futures = [self._pool.submit(simulate_task, t, str(out / t.run_id) if out else None) for t in tasks]
        try:
            for future in as_completed(futures):
                yield future.result()
        finally:
            for future in futures:
                future.cancel()

    def _ray_map(self, ray: ModuleType, tasks: list[RunTask], out: Path | None) -> Iterator[dict]:
        remote = ray.remote(num_cpus=1, max_retries=0)(simulate_task)
        data = {t.run_id: t.scenario_data for t in tasks}
        pending = [remote.remote(t, None, out is not None) for t in tasks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            outcome = ray.get(done[0])
            if out is not None:
                _write_on_driver(outcome, out / outcome["run_id"], data[outcome["run_id"]])
            yield outcome


def _write_on_driver(outcome: dict, run_dir: Path, scenario_data: dict) -> None:
    from sim.runner import write_run_folder

    if outcome["status"] == "ok":
        try:
            write_run_folder(outcome.pop("result"), run_dir, scenario_data)
        except MmsimError as error:  # e.g. a full disk: this run failed, the sweep goes on
            outcome.update(status="failed", error=f"MmsimError: {error}", summary=None)
    else:
        write_error(run_dir, outcome["details"])


def finished(run_dir: Path) -> dict | None:
    """The summary of a finished run (summary.json is written last), else None."""
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def run_sweep(tasks: list[RunTask], out: Path, *, axes: list[str], workers: int | None = None, use_ray: bool = False,
              ray_address: str | None = None, show_progress: bool = True, meta: dict | None = None) -> dict:
    """Run every task not already finished under OUT/runs/, keep OUT/index.* current, return what happened."""
    out = Path(out)
    runs_dir = out / "runs"
    check_same_runs(out, tasks)
    runs_dir.mkdir(parents=True, exist_ok=True)
    remove_temporaries(out)
    atomic_write(out / "sweep.json", lambda p: Path(p).write_text(json.dumps(
        {**(meta or {}), "axes": axes, "runs": len(tasks)}, indent=1, default=str)))
    rows: dict[str, dict] = {}
    todo = []
    for task in tasks:
        summary = finished(runs_dir / task.run_id)
        if summary is not None:
            rows[task.run_id] = make_row(task.run_id, task.axes, "ok", summary=summary)
        else:
            _clear_partial(runs_dir / task.run_id)
            todo.append(task)
    by_id = {t.run_id: t for t in tasks}
    ordered = lambda: [rows[t.run_id] for t in tasks if t.run_id in rows]  # noqa: E731 - index keeps sweep order
    write_index(out, ordered(), axes)
    started = time.perf_counter()
    run_seconds = 0.0
    failed = 0
    # No backend (and no Ray start-up) when everything is already done.
    backend = Backend(workers, use_ray, ray_address) if todo else contextlib.nullcontext()
    with progress_bar(show_progress, eta=True) as progress, backend as running:
        bar = progress.add_task("sweep", total=len(tasks), completed=len(tasks) - len(todo))
        for outcome in running.map(todo, runs_dir) if running is not None else ():
            task = by_id[outcome["run_id"]]
            run_seconds += outcome["wall_s"]
            failed += outcome["status"] != "ok"
            rows[task.run_id] = make_row(task.run_id, task.axes, outcome["status"], outcome["error"], outcome["summary"])
            write_index(out, ordered(), axes)
            progress.advance(bar)
    frame = write_index(out, ordered(), axes)
    return {"ran": len(todo), "skipped": len(tasks) - len(todo), "failed": failed, "wall_s": time.perf_counter() - started,
            "run_seconds": run_seconds, "index": frame}


def check_same_runs(out: Path, tasks: list[RunTask]) -> None:
    """Before any write: a finished run folder is kept only if it holds the run this sweep would make now (its
    scenario.json is the task's scenario); after the base scenario or the sweep file changed, keeping it would
    index runs of another scenario under this sweep's axes."""
    from sim.runner import holds_same_run

    for task in tasks:
        run_dir = out / "runs" / task.run_id
        if finished(run_dir) is not None and not holds_same_run(run_dir, task.scenario_data):
            raise MmsimError(f"holds runs made from another scenario (e.g. runs/{task.run_id}: the base scenario or "
                             "the sweep file changed since); give a new --out, or delete this folder to rerun the "
                             "sweep", source=str(out))


def check_sweep_folder(out: Path, name: str, axes: list[str]) -> None:
    """``out`` is new, empty, or this sweep's own folder (to resume): a sweep into another sweep's folder rewrote its
    index without that sweep's runs, and one into a folder of other files mixed them with its own."""
    if not out.is_dir():
        return
    entries = [e.name for e in out.iterdir() if not (e.name.startswith(".") and e.name.endswith((".tmp", ".old")))]
    if not entries or entries == ["runs"]:  # new, or stopped before it described itself
        return
    if "sweep.json" not in entries:
        raise MmsimError("holds other files and no sweep; give a new or empty folder with --out", source=str(out))
    try:
        meta = json.loads((out / "sweep.json").read_text())
    except (OSError, ValueError):
        meta = None
    if not isinstance(meta, dict) or meta.get("name") != name or meta.get("axes") != axes:
        found = f"sweep {meta.get('name')!r} over {meta.get('axes')}" if isinstance(meta, dict) else "a damaged sweep.json"
        raise MmsimError(f"holds {found}, not sweep {name!r} over {axes}; a sweep resumes only in its own folder: give "
                         "another --out", source=str(out))


def remove_temporaries(out: Path) -> None:
    """Delete the temporary files and folders (``.NAME.*.tmp``, ``.NAME.*.old``) a killed sweep left behind."""
    for folder in (out, out / "runs"):
        for entry in folder.glob(".*"):
            if not entry.name.endswith((".tmp", ".old")):
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _clear_partial(run_dir: Path) -> None:
    """An unfinished run folder (no summary.json) is redone from scratch."""
    if run_dir.is_dir():
        shutil.rmtree(run_dir)

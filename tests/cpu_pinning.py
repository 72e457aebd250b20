"""One core per xdist worker, when there are as many workers as cores (imported by tests/conftest.py
before anything imports MLX).

MLX runs each CPU op on a stream thread and wakes it once per dispatch; every `eval` then waits
for it to wake the caller back. When the two threads sit on different cores, each wake is a
cross-core interrupt, which on this project's VMs costs tens of microseconds (docs/testing.md has
the numbers). The Monte Carlo tests make hundreds of thousands of such waits on tiny models, so
the suite keeps each worker's threads (MLX's included, which inherit the mask) on one core.

On that core the worker also runs under SCHED_BATCH, which the kernel never lets preempt a thread
on wake-up: the stream thread, woken at each dispatch, no longer takes the core from the thread
still building the graph, and runs the queued ops when that thread waits for them.

Subprocesses (servers, CLIs, Schemathesis) get every core back, so they run as users run them.
"""

from __future__ import annotations

import os
import subprocess

# The cores this process could use before any pinning (what the machine offers the suite).
_MACHINE_CPUS: frozenset[int] = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()


def machine_cores() -> int:
    """Cores the machine offers the suite (a pinned worker's own mask shows one)."""
    return len(_MACHINE_CPUS) or os.cpu_count() or 1


def pin_this_worker() -> bool:
    """Pin the calling xdist worker to its own core when workers and cores are equal in number.

    Must run before MLX starts its threads. Returns True when it pinned.
    """
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (_MACHINE_CPUS and worker.startswith("gw") and count.isdigit() and int(count) == len(_MACHINE_CPUS)):
        return False
    os.sched_setaffinity(0, {sorted(_MACHINE_CPUS)[int(worker[2:])]})
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:  # a sandbox that filters the call: pinned alone still helps
        pass
    _unpin_children()
    return True


def _unpin_children() -> None:
    # A child inherits the spawning thread's mask and policy; hand it every core and the default
    # policy right after the spawn (its interpreter is still starting, long before it creates
    # threads of its own).
    spawn = subprocess.Popen._execute_child

    def execute_child(self, *args, **kwargs):
        spawn(self, *args, **kwargs)
        try:
            os.sched_setaffinity(self.pid, _MACHINE_CPUS)
            os.sched_setscheduler(self.pid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:  # it already exited
            pass

    subprocess.Popen._execute_child = execute_child

"""The suite's one-core-per-worker pinning (tests/cpu_pinning.py) never reaches the programs it starts."""

import os
import subprocess
import sys

from tests.cpu_pinning import machine_cores


def test_children_get_every_core():
    """A subprocess of a (possibly pinned) worker may run on every core the machine offers the suite."""
    code = "import os; print(len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == machine_cores()


def test_children_run_under_the_default_policy():
    """A worker's SCHED_BATCH (tests/cpu_pinning.py) is not handed to the programs it starts."""
    code = "import os; print(os.sched_getscheduler(0) if hasattr(os, 'sched_getscheduler') else 0)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == getattr(os, "SCHED_OTHER", 0)

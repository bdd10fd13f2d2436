"""The Kubernetes client used from several threads at once, as the agent does (a drain's thread
and the node watch): a fresh process whose threads make their first calls together must not
crash. msgspec 0.22 (lightkube's decoder) builds a type's decoding plan on its first use, and
two threads doing that at once crashed the process with a segmentation fault: a restarted agent
mid-drain then died in silence before its first record (issue 37, item 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.component.kubernetes.drainrig import NODE
from tests.doubles.kubeapi import KubeApiDouble
from tests.support.processes import PYTHON, Processes

THREADS = 8
# A crash came in about one fresh process in four: ten make one all but certain.
PROCESSES = 10
FIRST_CALLS = """
import sys, threading
from pathlib import Path
from bridge.kubernetes.client import LightkubeApi

api = LightkubeApi(Path(sys.argv[1]))
together = threading.Barrier({threads})
def call(number):
    together.wait()
    api.node(sys.argv[2]) if number % 2 else api.pods(sys.argv[2])
threads = [threading.Thread(target=call, args=(n,)) for n in range({threads})]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("done")
"""


@pytest.mark.slow  # ten fresh processes: about 10 s, 50 s on a loaded machine
def test_threads_making_their_first_calls_at_once_do_not_crash_the_process(
    kube: KubeApiDouble, procs: Processes, tmp_path: Path
) -> None:
    script = FIRST_CALLS.format(threads=THREADS)
    config = str(kube.kubeconfig(tmp_path))
    for attempt in range(PROCESSES):
        proc = procs.start(f"client-{attempt}", [PYTHON, "-X", "faulthandler", "-c", script,
                                                 config, NODE])  # fmt: skip
        code = proc.wait(timeout=60)
        assert (code, proc.stdout().strip()) == (0, "done"), proc.output()

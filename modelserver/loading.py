"""Load a version beside the ones serving: its own low-priority thread, paced warmup.

The binary loads in C++ on ``--num_load_threads``; here a load is Python (``tf.saved_model.load``
rebuilds every signature's graph, most of it holding the GIL) plus the warmup replay (the
export's records up to batch 32 x the longest bucket, on TensorFlow's intra-op pool, which
serving shares). On a host whose cores are already busy serving (the rollout drill's first real
run: 16 closed-loop clients, 2 cores) a MiniLM load took 66-157 s and queued client requests ran
past the gateway's 10 s timeout meanwhile. Two bounds keep serving first:

- the load runs on a thread of its own whose nice value is raised by ``--load_nice`` (Linux
  schedules threads one by one, so only the load loses priority; the thread ends with the load,
  so nothing needs to get its priority back, which an unprivileged process could not do);
- warmup replay sleeps after each record for as long as it ran times ``1 / duty - 1``
  (``--warmup_duty_cycle``), so its share of the intra-op pool is bounded and serving requests
  queued behind it get the pool in between. The initial load, before the ports open, has no
  request to yield to and replays back to back (``modelserver.server.make_loader``).

A load then takes longer (a 0.5 duty cycle doubles the warmup's wall time): availability of the
new version is traded for the latency of the ones serving, as a rollout wants.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def lower_this_thread(increment: int) -> int | None:
    """Raise this thread's nice value by ``increment``; return the new one (None: not done)."""
    if increment <= 0 or not hasattr(os, "setpriority"):
        return None
    tid = threading.get_native_id()
    try:
        nice = min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment)
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as exc:  # a container may refuse it: the load runs at normal priority
        log.warning("could not lower the loading thread's priority: %s", exc)
        return None
    return nice


def on_load_thread(work: Callable[[], T], nice: int, name: str = "load") -> T:
    """Run ``work`` on a new thread at ``nice`` more than normal; return (or raise) its result."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        lower_this_thread(nice)
        try:
            result.append(work())
        except BaseException as exc:  # handed back to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]

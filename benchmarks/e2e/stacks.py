"""The stacks a run starts, as production runs them: model servers and the gateways in front.

One model server (``python -m modelserver`` or ``TFS_BIN``, serving_config's batching file) with
three gunicorn gateways on it (docker/gunicorn.conf.py: the default, one with every request making
its own upstream call, one on gunicorn's own gthread worker), and a second model server running
each model call on one intra-op thread, with its own gateway.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.e2e.cells import Watched
from benchmarks.e2e.models import server_config
from benchmarks.e2e.plan import ALONE_SETTING, GTHREAD_WORKER, INTRA_FLAG, WORKER_SETTING, say
from ops.procs import ServerProcess
from ops.stack import start_gateway, start_modelserver

Started = TypeVar("Started", bound=tuple[Any, ...])  # (ServerProcess, ports or URL ...)


@dataclass
class Stacks:
    """Every process a run started, and the addresses the cells send to."""

    server: ServerProcess
    grpc_port: int
    rest_port: int
    gateway: str  # the default gateway's URL
    alone: str  # GATEWAY_GROUP_IN_FLIGHT=0: backend/grouping.py measured alone
    gthread: str  # gunicorn's gthread worker: backend/httpworker.py measured alone
    intra_grpc: int  # the model server with one intra-op thread per call
    intra_rest: int
    intra_gateway: str
    procs: dict[str, ServerProcess]  # by role: gateway, alone, gthread, intra, intra_gateway

    def watched(self) -> Watched:
        """Return the processes whose CPU each cell reads: every gateway, every model server."""
        gateways = ("gateway", "alone", "gthread", "intra_gateway")
        return Watched({
            "gateway": [self.procs[name].pid for name in gateways],
            "model server": [self.server.pid, self.procs["intra"].pid],
        })  # fmt: skip


def start_stacks(base: Path, config: Path, work: Path, started: list[ServerProcess]) -> Stacks:
    """Start the model servers and gateways; each process is appended to ``started`` as it
    starts, so the caller stops what did start when a later one fails.

    Both model servers load at once, then the four gateways boot at once: a load is mostly
    Python holding one core, a gunicorn boot too, and nothing is measured before all are up.
    """
    say(f"starting two modelservers (batching file; the second: {INTRA_FLAG}, tickets only) ...")
    intra_config = server_config(base, work / "models-intra.config", tickets_only=True)
    # Loading two MiniLM exports with warm-up took 161 s for one of them on a loaded 2-core host
    # (load average 20): 300 s, the helper's default, was not enough for the whole config.
    servers = _all_started(started, {
        "server": partial(start_modelserver, config, work, timeout_s=1200),
        "intra": partial(start_modelserver, intra_config, work, timeout_s=1200,
                         extra=[INTRA_FLAG]),
    })  # fmt: skip
    server, grpc_port, rest_port = servers["server"]
    _, intra_grpc, intra_rest = servers["intra"]
    say("starting their gunicorn gateways (docker/gunicorn.conf.py) ...")
    upstream = {"gateway": (grpc_port, rest_port, config), "alone": (grpc_port, rest_port, config),
                "gthread": (grpc_port, rest_port, config),
                "intra_gateway": (intra_grpc, intra_rest, intra_config)}  # fmt: skip
    settings = {"alone": {ALONE_SETTING: "0"}, "gthread": {WORKER_SETTING: GTHREAD_WORKER}}
    gateways = _all_started(started, {
        role: partial(start_gateway, "grpc", grpc, rest, base, cfg, work, timeout_s=600,
                      settings=settings.get(role, {}))
        for role, (grpc, rest, cfg) in upstream.items()
    })  # fmt: skip
    procs = {"intra": servers["intra"][0], **{role: proc for role, (proc, _) in gateways.items()}}
    urls = {role: url for role, (_, url) in gateways.items()}
    return Stacks(server, grpc_port, rest_port, urls["gateway"], urls["alone"], urls["gthread"],
                  intra_grpc, intra_rest, urls["intra_gateway"], procs)  # fmt: skip


def _all_started(
    started: list[ServerProcess], starts: dict[str, Callable[[], Started]]
) -> dict[str, Started]:
    """Run every start at once and return each one's result by name; each process that did
    start goes into ``started`` before the first failure (if any) is raised."""
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = {name: pool.submit(start) for name, start in starts.items()}
    done: dict[str, Started] = {}
    failures = []
    for name, future in futures.items():
        try:
            done[name] = future.result()
        except Exception as exc:  # raised below, once the others are kept for the caller
            failures.append(exc)
        else:
            started.append(done[name][0])
    if failures:
        raise failures[0]
    return done

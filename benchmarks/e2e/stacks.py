"""The stacks a run starts, as production runs them: model servers and the gateways in front.

One model server (``python -m modelserver`` or ``TFS_BIN``, serving_config's batching file) with
three gunicorn gateways on it (docker/gunicorn.conf.py: the default, one with every request making
its own upstream call, one on gunicorn's own gthread worker), and a second model server running
each model call on one intra-op thread, with its own gateway.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.e2e.cells import Watched
from benchmarks.e2e.models import server_config
from benchmarks.e2e.plan import ALONE_SETTING, GTHREAD_WORKER, INTRA_FLAG, WORKER_SETTING, say
from ops.procs import ServerProcess
from ops.stack import start_gateway, start_modelserver


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
    starts, so the caller stops what did start when a later one fails."""
    say("starting modelserver (batching file) + gunicorn (docker/gunicorn.conf.py) ...")
    # Loading two MiniLM exports with warm-up took 161 s for one of them on a loaded 2-core host
    # (load average 20): 300 s, the helper's default, was not enough for the whole config.
    server, grpc_port, rest_port = start_modelserver(config, work, timeout_s=1200)
    started.append(server)
    procs: dict[str, ServerProcess] = {}
    urls: dict[str, str] = {}
    for role, settings in (
        ("gateway", {}),
        ("alone", {ALONE_SETTING: "0"}),
        ("gthread", {WORKER_SETTING: GTHREAD_WORKER}),
    ):
        procs[role], urls[role] = start_gateway("grpc", grpc_port, rest_port, base, config, work,
                                                timeout_s=600, settings=settings)  # fmt: skip
        started.append(procs[role])
    say(f"starting a second modelserver ({INTRA_FLAG}, tickets only) + its gateway ...")
    intra_config = server_config(base, work / "models-intra.config", tickets_only=True)
    procs["intra"], intra_grpc, intra_rest = start_modelserver(
        intra_config, work, timeout_s=1200, extra=[INTRA_FLAG]
    )
    started.append(procs["intra"])
    procs["intra_gateway"], urls["intra_gateway"] = start_gateway(
        "grpc", intra_grpc, intra_rest, base, intra_config, work, timeout_s=600
    )
    started.append(procs["intra_gateway"])
    return Stacks(server, grpc_port, rest_port, urls["gateway"], urls["alone"], urls["gthread"],
                  intra_grpc, intra_rest, urls["intra_gateway"], procs)  # fmt: skip

"""The model server's ModelService (status, reload) for the ops tools, over stock gRPC.

The ops tools run beside TensorFlow (they export and push), so they use
``tensorflow_serving.apis``; the answers are read with ``modelformat.status`` like the gateway's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import backend.clients.endpoints as endpoints
from modelformat import status as model_status
from modelformat.status import VersionStatus
from ops.modelconfig import OpsError

# A channel of its own (gRPC shares connections between channels of one process by default, and
# a shared one to a replica that was down may sit in a long reconnect backoff, failing calls
# with UNAVAILABLE after the replica is back), reconnecting within ~1 s as the gateway does.
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]


class ModelServer:
    """ModelService calls (status, reload) against a TF-Serving-compatible server."""

    def __init__(self, target: str, timeout_s: float = 10.0):
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc

        self.target = target
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = model_service_pb2_grpc.ModelServiceStub(self._channel)

    def status(self, name: str) -> list[VersionStatus]:
        """Return the server's version states for ``name`` (empty when it knows no version)."""
        import grpc
        from tensorflow_serving.apis import get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = name
        try:
            reply = self._stub.GetModelStatus(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return []
            raise OpsError(f"GetModelStatus({name}) at {self.target}: {_rpc_text(exc)}") from exc
        return model_status.from_grpc(reply)

    def reload(self, config: Any, timeout_s: float = 60.0) -> None:
        """Send ``config`` with HandleReloadConfigRequest; raise OpsError with the reason."""
        import grpc
        from tensorflow_serving.apis import model_management_pb2

        request = model_management_pb2.ReloadConfigRequest()
        request.config.CopyFrom(config)
        try:
            self._stub.HandleReloadConfigRequest(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise OpsError(f"HandleReloadConfigRequest refused: {_rpc_text(exc)}") from exc

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


def replica_targets(specs: list[str]) -> list[str]:
    """Return one ``host:port`` per replica that ``specs`` name (repeated ``--server`` values).

    Each may be a comma-separated list, a gRPC target (``dns:///name:8500``, ``ipv4:a:p,b:p``) or
    a ``name:port`` whose DNS answer lists every replica (a headless Service); IP literals stay.
    """
    try:
        found = [t for spec in specs for t in endpoints.resolve(spec)]
    except endpoints.EndpointError as exc:
        raise OpsError(f"--server: {exc}") from exc
    if not found:
        raise OpsError("--server names no model server")
    return list(dict.fromkeys(found))


class ReplicaSet:
    """The replicas of one model server, driven together: each gets every config reload.

    ``status`` merges their answers (a version is AVAILABLE only when every replica reports it);
    ``wait_available_everywhere`` waits for and reports each replica.
    """

    def __init__(self, targets: list[str], timeout_s: float = 10.0):
        self.servers = [ModelServer(t, timeout_s) for t in targets]
        self.target = ",".join(targets)
        # The config every replica holds now; a reload one replica refuses is undone on those
        # that took it. (Set by the caller to what the replicas were started with or last got.)
        self.applied: Any = None

    def status(self, name: str) -> list[VersionStatus]:
        """Return the merged version states (OpsError if any replica does not answer)."""
        return model_status.merge_replicas([server.status(name) for server in self.servers])

    def reload(self, config: Any, timeout_s: float = 60.0) -> None:
        """Send ``config`` to every replica; if one refuses, put the others back and raise."""
        took: list[ModelServer] = []
        for server in self.servers:
            try:
                server.reload(config, timeout_s)
            except OpsError as exc:
                if self.applied is not None:
                    for done in took:
                        try:
                            done.reload(self.applied, timeout_s)
                        except OpsError as undo:
                            print(f"  could not restore {done.target}: {undo}", flush=True)
                raise OpsError(f"{server.target}: {exc}") from exc
            took.append(server)
        self.applied = config

    def close(self) -> None:
        """Close every channel."""
        for server in self.servers:
            server.close()


def wait_available_everywhere(
    replicas: ReplicaSet,
    name: str,
    version: int,
    timeout_s: float,
    progress: Callable[[str], None] = print,
) -> dict[str, float]:
    """Wait until every replica reports ``version`` AVAILABLE; return seconds per replica.

    One deadline bounds the whole wait; each replica's time is reported as it arrives, and the
    error names the replica that did not get there.
    """
    started = time.monotonic()
    took: dict[str, float] = {}
    for server in replicas.servers:
        left = max(0.0, timeout_s - (time.monotonic() - started))
        wait_available(server, name, version, left, progress)
        took[server.target] = time.monotonic() - started
        if len(replicas.servers) > 1:
            progress(
                f"  {name} v{version} AVAILABLE on {server.target} ({took[server.target]:.1f}s)"
            )
    return took


def _rpc_text(exc: Any) -> str:
    return f"{exc.code().name}: {exc.details()}"


def wait_available(
    server: ModelServer,
    name: str,
    version: int,
    timeout_s: float,
    progress: Callable[[str], None] = print,
    poll_s: float = 0.2,
) -> float:
    """Wait until ``version`` of ``name`` is AVAILABLE; return the seconds it took.

    Fails fast when the server reports the load ended with an error, and with a clear timeout
    error naming the last state seen otherwise.
    """
    started = time.monotonic()
    last = "not reported yet"
    shown = ""
    while True:
        states = {s.version: s for s in server.status(name)}
        entry = states.get(version)
        if entry is not None:
            error = entry.error_message
            last = entry.state + (f" ({error})" if error else "")
            if entry.state == model_status.AVAILABLE:
                return time.monotonic() - started
            if entry.state == "END" and error:
                raise OpsError(f"{name} version {version} failed to load: {error}")
        if last != shown:
            progress(f"  {name} v{version}: {last}")
            shown = last
        if time.monotonic() - started > timeout_s:
            raise OpsError(
                f"{name} version {version} not AVAILABLE after {timeout_s:.0f}s at "
                f"{server.target} (last state: {last}); is the server polling {name}'s base path?"
            )
        time.sleep(poll_s)

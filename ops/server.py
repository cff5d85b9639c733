"""The model server's ModelService (status, reload) for the ops tools, over stock gRPC.

The messages are the gateway's own (``modelformat.protos``; the reload request holds the bytes
of ``tensorflow_serving``'s ModelServerConfig, the same on the wire): ``tensorflow_serving.apis``
imports all of TensorFlow (seconds of CPU in every rollout.py and push_model that talks to a
server, none of which runs a model). The answers are read with ``modelformat.status`` like the
gateway's.
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


RELOAD_CONFIG = "/tensorflow.serving.ModelService/HandleReloadConfigRequest"


class ModelServer:
    """ModelService calls (status, reload) against a TF-Serving-compatible server."""

    def __init__(self, target: str, timeout_s: float = 10.0):
        import grpc

        from backend.clients.grpc_client import GET_MODEL_STATUS
        from modelformat.protos import serving_pb2

        self.target = target
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._status = self._channel.unary_unary(
            GET_MODEL_STATUS,
            request_serializer=serving_pb2.GetModelStatusRequest.SerializeToString,
            response_deserializer=serving_pb2.GetModelStatusResponse.FromString,
        )
        # the ReloadConfigResponse is not read: a refusal is the call's gRPC status
        self._reload = self._channel.unary_unary(
            RELOAD_CONFIG, request_serializer=reload_config_request
        )

    def status(self, name: str) -> list[VersionStatus]:
        """Return the server's version states for ``name`` (empty when it knows no version)."""
        import grpc

        from modelformat.protos import serving_pb2

        request = serving_pb2.GetModelStatusRequest()
        request.model_spec.name = name
        try:
            reply = self._status(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return []
            raise OpsError(f"GetModelStatus({name}) at {self.target}: {_rpc_text(exc)}") from exc
        return model_status.from_grpc(reply)

    def reload(self, config: Any, timeout_s: float = 60.0) -> None:
        """Send ``config`` with HandleReloadConfigRequest; raise OpsError with the reason."""
        import grpc

        try:
            self._reload(config, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise OpsError(f"HandleReloadConfigRequest refused: {_rpc_text(exc)}") from exc

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


def reload_config_request(config: Any) -> bytes:
    """Return the bytes of a ReloadConfigRequest holding ``config`` (a ModelServerConfig)."""
    from modelformat.protos import config_pb2

    request = config_pb2.ReloadConfigRequest(config=config.SerializeToString())
    return request.SerializeToString()


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

    The set is what ``specs`` resolve to (``endpoints.resolve``, the gateway's own view of the
    replicas), resolved again before each reload and on each poll of a wait: a replica that
    joins mid-push (the autoscaler's new pod) gets the config the others hold and is waited
    on; one that left the DNS answer (a pod removed) is dropped, which is not a failure. One
    that is still named but does not answer is a failure, and ``check_reachable`` finds it
    before anything is published.
    """

    def __init__(
        self, specs: list[str], timeout_s: float = 10.0, progress: Callable[[str], None] = print
    ):
        self.specs = list(specs)
        self.timeout_s = timeout_s
        self.progress = progress
        self.servers = [ModelServer(t, timeout_s) for t in replica_targets(self.specs)]
        # The config every replica holds now; a reload one replica refuses is undone on those
        # that took it. (Set by the caller to what the replicas were started with or last got.)
        self.applied: Any = None
        self._unsynced: set[str] = set()  # joined after the start: not sent ``applied`` yet

    @property
    def target(self) -> str:
        return ",".join(s.target for s in self.servers)

    def refresh(self) -> None:
        """Resolve the specs again: add the replicas that appeared, drop those that are gone.

        A failed resolution keeps the replicas known (a DNS hiccup is not a scale-down).
        """
        try:
            targets = replica_targets(self.specs)
        except OpsError as exc:
            self.progress(f"  could not resolve the replicas again ({exc}); keeping {self.target}")
            return
        known = {s.target: s for s in self.servers}
        for target, server in known.items():
            if target not in targets:
                self.progress(f"  replica {target} left the set; not waiting for it")
                server.close()
        for target in targets:
            if target not in known:
                self.progress(f"  replica {target} joined the set")
                self._unsynced.add(target)
        self.servers = [known.get(t) or ModelServer(t, self.timeout_s) for t in targets]
        self._unsynced &= set(targets)

    def has(self, server: ModelServer) -> bool:
        """Return whether ``server`` is still in the set after resolving again."""
        self.refresh()
        return any(s.target == server.target for s in self.servers)

    def check_reachable(self, name: str) -> None:
        """Raise OpsError naming every replica that does not answer GetModelStatus for ``name``.

        Called before anything is written or published: a push that cannot reach a replica
        must stop while stopping costs nothing.
        """
        down = []
        for server in self.servers:
            try:
                server.status(name)
            except OpsError as exc:
                down.append(f"{server.target} ({exc})")
        if down:
            raise OpsError(
                f"replica down: {'; '.join(down)}; nothing was published or changed (start it, "
                "or let it leave the replica set, and push again)"
            )

    def status(self, name: str) -> list[VersionStatus]:
        """Return the merged version states (OpsError if any replica does not answer)."""
        return model_status.merge_replicas([server.status(name) for server in self.servers])

    def reload(self, config: Any, timeout_s: float = 60.0) -> None:
        """Send ``config`` to every replica; if one refuses, put the others back and raise.

        A replica that refuses because it has left the set is skipped.
        """
        self.refresh()
        took: list[ModelServer] = []
        for server in list(self.servers):
            try:
                server.reload(config, timeout_s)
            except OpsError as exc:
                if not self.has(server):
                    continue
                if self.applied is not None:
                    for done in took:
                        try:
                            done.reload(self.applied, timeout_s)
                        except OpsError as undo:
                            self.progress(f"  could not restore {done.target}: {undo}")
                raise OpsError(f"{server.target}: {exc}") from exc
            took.append(server)
            self._unsynced.discard(server.target)
        self.applied = config

    def reload_each(self, config: Any, timeout_s: float = 60.0) -> dict[str, str]:
        """Send ``config`` to every replica, undoing nothing; return target -> error of refusals.

        For putting a config back after a failure: a replica that is down must not keep the
        live ones from getting it.
        """
        self.refresh()
        refused = {}
        for server in self.servers:
            try:
                server.reload(config, timeout_s)
            except OpsError as exc:
                refused[server.target] = str(exc)
            else:
                self._unsynced.discard(server.target)
        self.applied = config
        return refused

    def synced(self, server: ModelServer) -> bool:
        """Return whether ``server`` holds ``applied``, sending it first to one that joined.

        A replica that has just joined may not listen yet: False, and the next poll tries again.
        """
        if server.target not in self._unsynced or self.applied is None:
            return True
        try:
            server.reload(self.applied, self.timeout_s)
        except OpsError:
            return False
        self._unsynced.discard(server.target)
        return True

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
    poll_s: float = 0.2,
) -> dict[str, float]:
    """Wait until every replica in the set reports ``version`` AVAILABLE; return seconds per one.

    The set is resolved again on every poll: a replica that joins is sent the config and waited
    on, one that leaves is not waited for. A replica that does not answer is asked again until
    the one deadline; the error names each replica that did not get there and its last state.
    """
    started = time.monotonic()
    took: dict[str, float] = {}
    last: dict[str, str] = {}
    while True:
        replicas.refresh()
        if not replicas.servers:
            raise OpsError(f"no replica of {name} is left to wait for")
        for server in replicas.servers:
            if server.target in took:
                continue
            state = _version_state(replicas, server, name, version)
            if state == model_status.AVAILABLE:
                took[server.target] = time.monotonic() - started
                if len(replicas.servers) > 1:
                    progress(
                        f"  {name} v{version} AVAILABLE on {server.target} "
                        f"({took[server.target]:.1f}s)"
                    )
            elif state != last.get(server.target):
                progress(f"  {name} v{version} on {server.target}: {state}")
            last[server.target] = state
        current = [s.target for s in replicas.servers]
        if all(t in took for t in current):
            return {t: took[t] for t in current}
        if time.monotonic() - started > timeout_s:
            behind = [t for t in current if t not in took]
            waiting = "; ".join(f"{t}: {last.get(t, 'no answer')}" for t in behind)
            raise OpsError(
                f"{name} version {version} not AVAILABLE after {timeout_s:.0f}s at {waiting}; "
                f"is the server polling {name}'s base path?"
            )
        time.sleep(poll_s)


def _version_state(replicas: ReplicaSet, server: ModelServer, name: str, version: int) -> str:
    """Return ``version``'s state on ``server`` (or why it has none); raise if its load failed."""
    if not replicas.synced(server):
        return "joined, not answering yet"
    try:
        states = {s.version: s for s in server.status(name)}
    except OpsError as exc:
        return f"not answering ({exc})"
    entry = states.get(version)
    if entry is None:
        return "not reported yet"
    if entry.state == "END" and entry.error_message:
        raise OpsError(f"{name} version {version} failed to load: {entry.error_message}")
    return entry.state + (f" ({entry.error_message})" if entry.error_message else "")


def _rpc_text(exc: Any) -> str:
    return f"{exc.code().name}: {exc.details()}"

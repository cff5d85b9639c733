"""The model server's ModelService (status, reload) for the ops tools, over stock gRPC.

The ops tools run beside TensorFlow (they export and push), so they use
``tensorflow_serving.apis``; the answers are read with ``modelformat.status`` like the gateway's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from modelformat import status as model_status
from modelformat.status import VersionStatus
from ops.modelconfig import OpsError


class ModelServer:
    """ModelService calls (status, reload) against a TF-Serving-compatible server."""

    def __init__(self, target: str, timeout_s: float = 10.0):
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc

        self.target = target
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(target)
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

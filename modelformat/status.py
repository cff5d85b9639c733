"""GetModelStatus: the version states a model server reports, from gRPC or REST, in one shape.

Several replicas of one model merge into one answer (``merge_replicas``).

The state numbers and names are TF Serving's ``ModelVersionStatus.State`` enum
(``get_model_status.proto``); the REST API reports the names. Any message with TF Serving's field
names parses (the gateway's own ``modelformat.protos`` classes or ``tensorflow_serving.apis``').
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# ModelVersionStatus.State, number -> name.
STATES = {0: "UNKNOWN", 10: "START", 20: "LOADING", 30: "AVAILABLE", 40: "UNLOADING", 50: "END"}
AVAILABLE = "AVAILABLE"
# tensorflow.error.Code, number -> name (the ``status.error_code`` of an entry).
ERROR_CODES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}  # fmt: skip


@dataclass(frozen=True)
class VersionStatus:
    """One entry of the model server's GetModelStatus answer."""

    version: int
    state: str  # UNKNOWN, START, LOADING, AVAILABLE, UNLOADING, END
    error_code: str = "OK"
    error_message: str = ""


def newest_first(statuses: Iterable[VersionStatus]) -> list[VersionStatus]:
    """Return ``statuses`` sorted by version, newest first."""
    return sorted(statuses, key=lambda s: s.version, reverse=True)


def from_grpc(reply: Any) -> list[VersionStatus]:
    """Return the versions of a ``GetModelStatusResponse`` message, newest first."""
    return newest_first(
        VersionStatus(
            version=int(entry.version),
            state=STATES.get(int(entry.state), "UNKNOWN"),
            error_code=ERROR_CODES.get(int(entry.status.error_code), str(entry.status.error_code)),
            error_message=str(entry.status.error_message),
        )
        for entry in reply.model_version_status
    )


def from_rest(reply: Any) -> list[VersionStatus]:
    """Return the versions of ``GET /v1/models/<name>``'s JSON body, newest first."""
    entries = reply.get("model_version_status", []) if isinstance(reply, Mapping) else []
    return newest_first(
        VersionStatus(
            version=int(entry.get("version", 0)),
            state=str(entry.get("state", "UNKNOWN")),
            error_code=str(entry.get("status", {}).get("error_code", "OK")),
            error_message=str(entry.get("status", {}).get("error_message", "")),
        )
        for entry in entries
    )


def newest_available(statuses: Sequence[VersionStatus]) -> int | None:
    """Return the highest AVAILABLE version, or None."""
    available = [s.version for s in statuses if s.state == AVAILABLE]
    return max(available) if available else None


def merge_replicas(replicas: Sequence[Sequence[VersionStatus]]) -> list[VersionStatus]:
    """Return one answer for several replicas of a model: AVAILABLE only where all report it.

    A version some replica lacks or holds in another state takes that replica's entry (a
    version it does not report at all: UNKNOWN), so ``newest_available`` of the result is a
    version every replica can serve.
    """
    if len(replicas) == 1:
        return newest_first(replicas[0])
    by_replica = [{s.version: s for s in statuses} for statuses in replicas]
    merged = []
    for version in set().union(*by_replica):
        entries = [states.get(version, VersionStatus(version, "UNKNOWN")) for states in by_replica]
        lagging = [e for e in entries if e.state != AVAILABLE]
        merged.append(lagging[0] if lagging else entries[0])
    return newest_first(merged)

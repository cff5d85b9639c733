"""Which version a default request goes to: the routing file's weights, read like the labels.

Sits between version resolution and the call (docs/guides/rollouts.md). Only requests that name
neither a version nor a label are split; the file (``modelformat.routing``) is re-read every
``GATEWAY_LABELS_CACHE_S`` with the labels' rule (``backend.reloading``: content hashed, a broken
file keeps the last good routing and raises ``gateway_routing_stale``); a missing file routes
nothing. The routing key (the API key's name when keys are on, so a client can't pick its side of
the split; ``X-Route-Key`` only without keys) lives in a context variable the app sets per request,
so the service reads it without Flask.
"""

from __future__ import annotations

import logging
import random
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from backend import metrics
from backend.reloading import ReloadingFile
from modelformat import routing
from modelformat.routing import ModelRoute, Routing

log = logging.getLogger(__name__)

ROUTE_KEY_HEADER = "X-Route-Key"
FILE_NAME = "routing.yaml"

# The routing key of the request this thread serves (None: split at random by weight).
route_key: ContextVar[str | None] = ContextVar("route_key", default=None)
# (model, version) the request resolved to, set before the upstream call: a request that fails
# after resolution still counts against the version it was sent to (the rollout's error rate).
resolved_version: ContextVar[tuple[str, int] | None] = ContextVar("resolved_version", default=None)
# Whether the request named a version or a label (pinned): only the others (default traffic, which
# the weights split) count in the series a rollout decides on.
pinned: ContextVar[bool] = ContextVar("pinned", default=False)
# The shadow job of the request this thread serves: the app queues it once the answer is built
# (a job queued earlier could run while the view still uses what it shares with the request).
pending_shadow: ContextVar[Any] = ContextVar("pending_shadow", default=None)


def start_request(key: str | None) -> None:
    """Reset the per-request routing state of this thread (threads serve many requests)."""
    route_key.set(key)
    resolved_version.set(None)
    pinned.set(False)
    pending_shadow.set(None)


def routing_file_for(routing_file: str, model_config_file: str) -> Path | None:
    """Return the routing file's path: the setting, else routing.yaml beside models.config."""
    if routing_file:
        return Path(routing_file)
    if model_config_file:
        return Path(model_config_file).parent / FILE_NAME
    return None


class RoutingTable:
    """The routing file's content, at most ``recheck_s`` old (nothing when there is no file)."""

    def __init__(self, path: Path | None, recheck_s: float = 1.0) -> None:
        self.path = path
        self._rng = random.Random()
        self._file: ReloadingFile[Routing] | None = None
        if path is not None:
            self._file = ReloadingFile(
                path, lambda data: routing.parse(data.decode("utf-8"), source=str(path)),
                routing.EMPTY, recheck_s=recheck_s, what="routing file",
                errors=metrics.ROUTING_ERRORS, stale=metrics.ROUTING_STALE, logger=log,
            )  # fmt: skip

    def route(self, model: str) -> ModelRoute | None:
        """Return ``model``'s route (weights and shadow), or None when it is not split."""
        if self._file is None:
            return None
        if not self._file.path.exists():
            return None  # no file: nothing is split (a file that breaks keeps its last value)
        return self._file.get().route(model)

    def choose(self, model: str, route: ModelRoute) -> int | None:
        """Return the version ``route`` sends this request to, counting how it was chosen."""
        key = route_key.get()
        version = route.choose(key, model, self._rng)
        if version is not None:
            how = "key" if key is not None else "random"
            metrics.child(metrics.ROUTED, model, str(version), how).inc()
        return version

    def shadow_for(self, route: ModelRoute, served: int) -> int | None:
        """Return the version to shadow a request ``served`` answered, or None."""
        return route.shadow_version(served, self._rng)

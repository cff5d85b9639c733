"""``/readyz``: is this gateway worker ready for traffic? The models of the serving config decide.

A worker is ready for the first time once the model server answers and every model the serving
config (GATEWAY_MODEL_CONFIG_FILE) names, plus GATEWAY_DEFAULT_MODEL when set, has an AVAILABLE
version: no model name is written in compose, Kubernetes or the gateway's settings. From then on
a model that joins the config later (``push_model.py --add``) is not waited on: every gateway
reads the same file, so waiting on it would take every pod out of the Service while the new
model loads, an outage for the models already served. The model server must still answer, and
the default model (when set) must stay AVAILABLE. The answer lists every model of the config with
its newest AVAILABLE version (null while it has none).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from backend.clients import newest_available
from backend.errors import GatewayError, NotFound, NotReady, UpstreamError
from backend.versions import LabelTable, StatusCache
from modelformat.status import VersionStatus


class Readiness:
    """The ready answer of one worker (the first-ready latch is per worker)."""

    def __init__(
        self,
        statuses: StatusCache,
        labels: LabelTable,
        default_model: str,
        probe: Callable[[], list[VersionStatus]],
        retry_after_s: int,
    ) -> None:
        self.statuses = statuses
        self.labels = labels
        self.default_model = default_model
        self.probe = probe  # any answer from the model server at all (no model needed)
        self.retry_after_s = retry_after_s
        self._ready_once = threading.Event()

    def names(self) -> list[str]:
        """Return the models the answer reports: the config's, and the default model."""
        names = self.labels.models()
        if self.default_model and self.default_model not in names:
            names.append(self.default_model)
        return names

    def required(self) -> set[str]:
        """Return the models that must be AVAILABLE now (all of them until first ready)."""
        if not self._ready_once.is_set():
            return set(self.names())
        return {self.default_model} if self.default_model else set()

    def check(self) -> dict[str, Any]:
        """Return the ready answer, or raise NotReady (503) naming what is missing.

        The answer lists every model of the config with its newest AVAILABLE version (null
        while none is): the same on every worker, whichever has been ready before.
        """
        names, required = self.names(), self.required()
        versions: dict[str, int | None] = {}
        try:
            if not names:
                self.probe()
            for model in names:
                # The cached, merged states: a refresh slowed by a hung replica serves the last
                # answer, so the probe never waits on it.
                version = self._newest(model, model in required)
                if version is None and model in required:
                    raise NotReady(f"model {model!r} has no AVAILABLE version yet")
                versions[model] = version
        except NotReady:
            raise
        except GatewayError as exc:  # the model server does not answer
            raise NotReady(
                f"model server not ready: {exc.message}", retry_after_s=self.retry_after_s
            ) from exc
        self._ready_once.set()
        default = self.default_model
        return {
            "status": "ready",
            "model": default or None,
            "version": versions.get(default) if default else None,
            "models": versions,
        }

    def _newest(self, model: str, required: bool) -> int | None:
        try:
            return newest_available(self.statuses.get(model))
        except (NotFound, UpstreamError) as exc:
            if required:
                raise NotReady(f"model {model!r} is not ready: {exc.message}") from None
            return None

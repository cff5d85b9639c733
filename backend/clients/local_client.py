"""Local transport: the newest version on disk, run in-process (imports TensorFlow lazily)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from backend.clients.base import Outputs
from backend.errors import (
    GatewayError,
    LabelNotFound,
    ModelNotFound,
    UpstreamError,
    VersionNotFound,
)
from modelformat.status import VersionStatus

log = logging.getLogger(__name__)


class LocalClient:
    """PredictClient over ``export.predictor.LatestVersionPredictor``, one per model directory."""

    transport = "local"
    enforces_deadline = False  # a TF call cannot be interrupted; the caller waits with a timeout

    def __init__(
        self, base_path: str | Path, *, poll_interval_s: float = 1.0, preload: bool = True
    ) -> None:
        self.base_path = Path(base_path)
        self.poll_interval_s = poll_interval_s
        self._predictors: dict[str, Any] = {}
        self._lock = threading.Lock()
        if preload:
            self.preload()

    def preload(self) -> list[str]:
        """Load every model under the base path now; return the names that loaded.

        Loading takes seconds (TensorFlow import + SavedModel load): doing it when the worker
        starts keeps it out of the first request's deadline, as a model server loads at startup.
        """
        loaded = []
        children = sorted(self.base_path.iterdir()) if self.base_path.is_dir() else []
        for child in children:
            if not child.is_dir() or child.name.startswith("."):
                continue
            try:
                self._predictor(child.name)
            except GatewayError as exc:
                log.warning("local transport: not serving %s: %s", child.name, exc.message)
                continue
            loaded.append(child.name)
        return loaded

    def _predictor(self, model: str) -> Any:
        """Return the model's predictor, loading it on first use."""
        with self._lock:
            predictor = self._predictors.get(model)
            if predictor is not None:
                return predictor
            model_dir = self.base_path / model
            if not model or "/" in model or model.startswith(".") or not model_dir.is_dir():
                raise ModelNotFound(f"model {model!r} is not served (no directory {model_dir})")
            # Imported here so that only the local transport ever loads TensorFlow.
            from export.predictor import LatestVersionPredictor

            try:
                predictor = LatestVersionPredictor(model_dir, poll_interval_s=self.poll_interval_s)
            except FileNotFoundError as exc:
                raise ModelNotFound(f"model {model!r} has no complete version") from exc
            self._predictors[model] = predictor
            return predictor

    def predict(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: int | None = None,
        label: str | None = None,
        timeout_s: float,
        signature_name: str | None = None,
        output_filter: Sequence[str] = (),  # in process: every output comes back
    ) -> tuple[Outputs, int]:
        """Run the newest loaded version; a different explicit version is not served here."""
        if label is not None:
            raise LabelNotFound("the local transport serves the newest version only (no labels)")
        predictor = self._predictor(model)
        if version is not None and predictor.version != version:
            predictor.refresh()  # the version may have just been published
            if predictor.version != version:
                raise VersionNotFound(
                    f"model {model!r} version {version} is not loaded (serving {predictor.version})"
                )
        from export.predictor import PredictorError

        try:
            outputs, served = predictor.predict_versioned(dict(inputs), signature_name)
        except PredictorError as exc:
            raise UpstreamError(f"the model rejected the request: {exc}") from exc
        if version is not None and served != version:
            raise VersionNotFound(
                f"model {model!r} version {version} is not loaded (serving {served})"
            )
        return outputs, int(served if served is not None else -1)

    def model_status(self, model: str, *, timeout_s: float) -> list[VersionStatus]:
        """Return the one version this process serves as AVAILABLE."""
        predictor = self._predictor(model)
        return [VersionStatus(version=int(predictor.version or 0), state="AVAILABLE")]

    def close(self) -> None:
        """Stop following new versions."""
        with self._lock:
            for predictor in self._predictors.values():
                predictor.close()
            self._predictors.clear()

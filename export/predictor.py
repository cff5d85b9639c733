"""Persistent in-process predictors: load a SavedModel once, predict many times.

``Estimator.predict`` rebuilt the graph and reloaded the checkpoint on every call; these keep the
loaded model for the life of the process. ``PersistentPredictor`` serves one version directory;
``LatestVersionPredictor`` follows the newest complete version of a model directory and swaps to
a new one only after it has loaded, so no call is dropped during the swap.
Used by the gateway's ``local`` transport and by ``modelserver/``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from modelformat.layout import latest_version, parse_version, read_model_info, version_dir

log = logging.getLogger(__name__)

DEFAULT_SIGNATURE = "serving_default"


class PredictorError(ValueError):
    """A request the loaded model cannot run: unknown signature, missing or unexpected inputs."""


@dataclass(frozen=True)
class TensorSpecInfo:
    """Name, numpy dtype and static shape (None for dynamic dims) of a signature tensor."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int | None, ...] | None


def _import_tf() -> Any:
    import tensorflow as tf  # imported here so that importing this module stays TF-free

    return tf


class PersistentPredictor:
    """A SavedModel version loaded once; ``predict`` is safe to call from many threads at once."""

    def __init__(self, path: str | Path) -> None:
        tf = _import_tf()
        self.path = Path(path)
        self.version: int | None = parse_version(self.path.name)
        started = time.perf_counter()
        self._loaded = tf.saved_model.load(str(self.path))
        self._signatures: dict[str, Any] = dict(self._loaded.signatures)
        self.load_time_s = time.perf_counter() - started
        self.model_info: dict[str, Any] | None = read_model_info(self.path)

    @property
    def signature_names(self) -> list[str]:
        """Return the names of the model's signatures."""
        return sorted(self._signatures)

    def _function(self, signature_name: str | None) -> Any:
        name = signature_name or DEFAULT_SIGNATURE
        try:
            return self._signatures[name]
        except KeyError:
            raise PredictorError(f'Serving signature key "{name}" not found.') from None

    def input_specs(self, signature_name: str | None = None) -> dict[str, TensorSpecInfo]:
        """Return the inputs of a signature by name."""
        _, kwargs = self._function(signature_name).structured_input_signature
        return {name: _spec_info(name, spec) for name, spec in kwargs.items()}

    def output_specs(self, signature_name: str | None = None) -> dict[str, TensorSpecInfo]:
        """Return the outputs of a signature by name."""
        outputs = self._function(signature_name).structured_outputs
        return {name: _spec_info(name, spec) for name, spec in outputs.items()}

    def predict(
        self, inputs: Mapping[str, np.ndarray], signature_name: str | None = None
    ) -> dict[str, np.ndarray]:
        """Run one signature on numpy inputs and return its outputs as numpy arrays."""
        tf = _import_tf()
        fn = self._function(signature_name)
        specs = self.input_specs(signature_name)
        missing = sorted(set(specs) - set(inputs))
        extra = sorted(set(inputs) - set(specs))
        if missing or extra:
            raise PredictorError(
                f"inputs do not match the signature: missing {missing}, unexpected {extra}"
            )
        feeds = {
            name: tf.convert_to_tensor(np.asarray(value), dtype=tf.as_dtype(specs[name].dtype))
            for name, value in inputs.items()
        }
        outputs = fn(**feeds)
        return {name: tensor.numpy() for name, tensor in outputs.items()}


def _spec_info(name: str, spec: Any) -> TensorSpecInfo:
    shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
    return TensorSpecInfo(name=name, dtype=np.dtype(spec.dtype.as_numpy_dtype), shape=shape)


class LatestVersionPredictor:
    """Follows the newest complete version under ``model_dir``; swaps after the new one loads.

    In-flight calls keep a reference to the predictor they started with, so a swap never
    interrupts them; a version that fails to load is logged and skipped while the current
    one keeps serving.
    """

    def __init__(
        self,
        model_dir: str | Path,
        poll_interval_s: float = 1.0,
        loader: Callable[[Path], PersistentPredictor] = PersistentPredictor,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.poll_interval_s = poll_interval_s
        self._loader = loader
        self._failed: set[int] = set()
        self._swap_lock = threading.Lock()
        self._stop = threading.Event()
        newest = latest_version(self.model_dir)
        if newest is None:
            raise FileNotFoundError(f"no complete version under {self.model_dir}")
        self._current = loader(version_dir(self.model_dir, newest))
        self._thread: threading.Thread | None = None
        if poll_interval_s > 0:
            self._thread = threading.Thread(
                target=self._poll_forever, name=f"latest-version-{self.model_dir.name}", daemon=True
            )
            self._thread.start()

    @property
    def current(self) -> PersistentPredictor:
        """Return the predictor serving now."""
        return self._current

    @property
    def version(self) -> int | None:
        """Return the version serving now."""
        return self._current.version

    def predict(
        self, inputs: Mapping[str, np.ndarray], signature_name: str | None = None
    ) -> dict[str, np.ndarray]:
        """Run the newest loaded version."""
        return self._current.predict(inputs, signature_name)

    def predict_versioned(
        self, inputs: Mapping[str, np.ndarray], signature_name: str | None = None
    ) -> tuple[dict[str, np.ndarray], int | None]:
        """Run the newest loaded version and return its outputs with the version that served."""
        predictor = self._current  # one read: outputs and version come from the same predictor
        return predictor.predict(inputs, signature_name), predictor.version

    def refresh(self) -> bool:
        """Load a newer version if there is one; return True when a swap happened."""
        with self._swap_lock:
            newest = latest_version(self.model_dir)
            current = self._current.version or -1
            if newest is None or newest <= current or newest in self._failed:
                return False
            try:
                loaded = self._loader(version_dir(self.model_dir, newest))
            except Exception:
                log.exception(
                    "version %s of %s failed to load; keeping %s", newest, self.model_dir, current
                )
                self._failed.add(newest)
                return False
            self._current = loaded  # a single reference assignment: atomic for readers
            log.info(
                "now serving %s version %s (loaded in %.2fs)",
                self.model_dir.name,
                newest,
                loaded.load_time_s,
            )
            return True

    def _poll_forever(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            self.refresh()

    def close(self) -> None:
        """Stop following new versions."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

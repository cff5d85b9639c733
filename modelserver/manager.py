"""Model lifecycle: config, file-system polling, availability-preserving loads, labels, lookups."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from modelserver import versions as vs
from modelserver.config import validate_config
from modelserver.errors import ServingError, failed_precondition, invalid, not_found
from modelserver.servable import LoadedVersion

log = logging.getLogger(__name__)

Loader = Callable[[Path], LoadedVersion]
# How long a reload waits for its added models when the caller set no deadline (a gRPC reload
# without one, the config-file poller): TF Serving's own budget for a failing load, its default
# --max_num_load_retries (5) x --load_retry_interval_micros (60 s). TF Serving itself waits
# forever there (issue #1519); a bound lets a stuck model fail its reload instead.
DEFAULT_WAIT_S = 300.0


@dataclass
class VersionStatus:
    """The published state of one version (what GetModelStatus reports)."""

    version: int
    state: int
    error: ServingError | None = None
    servable: LoadedVersion | None = None


@dataclass
class ModelState:
    """One configured (or formerly configured) model and its versions."""

    config: Any
    versions: dict[int, VersionStatus] = field(default_factory=dict)
    labels: dict[str, int] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)
    removed: bool = False
    missing: str | None = None  # "Could not find base path ..." while the base path is absent


class ModelManager:
    """Owns every model's versions; thread-safe; one poll thread does loads and unloads."""

    def __init__(
        self, loader: Loader = LoadedVersion, allow_labels_for_unavailable: bool = False
    ) -> None:
        self._loader = loader
        self._allow_unavailable_labels = allow_labels_for_unavailable
        self.wait_s = DEFAULT_WAIT_S
        self._generation = 0  # bumped by every config applied; labels follow the newest
        self._models: dict[str, ModelState] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._poll_lock = threading.Lock()  # one poll (load/unload pass) at a time
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.config: Any = None

    # ---- configuration -------------------------------------------------------------------
    def apply_config(
        self, config: Any, initial: bool = False, timeout_s: float | None = None
    ) -> None:
        """Apply a ModelServerConfig: add, change and remove models, then set labels.

        Initial configs check labels before loading (so labels on not-yet-loaded versions fail
        unless allowed, as in TF Serving); reloads wait for newly added models first, at most
        ``timeout_s`` (``wait_s`` when None), without holding any lock a later reload needs:
        when that later config arrives meanwhile, its labels win.
        """
        models = validate_config(config)
        with self._lock:
            added = [
                m.name for m in models if m.name not in self._models or self._models[m.name].removed
            ]
            if initial:
                self._check_labels(models)
            new_names = {m.name for m in models}
            for model in models:
                state = self._models.get(model.name)
                if state is None:
                    self._models[model.name] = ModelState(config=model)
                else:
                    if state.removed:  # re-added: old failures must not fail the new wait
                        state.failed = set()
                    state.config, state.removed = model, False
            for name, state in self._models.items():
                if name not in new_names and not state.removed:
                    state.removed = True
                    state.labels = {}
            self.config = config
            self._generation += 1
            generation = self._generation
            if initial:
                self._set_labels(models)
        self._wake.set()
        if initial:
            self.poll_once()
            self._raise_if_unavailable([m.name for m in models], timeout_s)
            return
        self._raise_if_unavailable(added, timeout_s)
        with self._lock:
            if generation != self._generation:
                return  # a newer config was applied while this one waited
            self._check_labels(models)
            self._set_labels(models)

    def _check_labels(self, models: list[Any]) -> None:
        for model in models:
            state = self._models.get(model.name)
            current = state.labels if state and not state.removed else {}
            for label, version in model.version_labels.items():
                if current.get(label) == version:
                    continue
                status = state.versions.get(version) if state else None
                if status is not None and status.state == vs.AVAILABLE:
                    continue
                if self._allow_unavailable_labels and label not in current:
                    continue
                raise failed_precondition(
                    f"Request to assign label to version {version} of model {model.name}, "
                    "which is not currently available for inference"
                )

    def _set_labels(self, models: list[Any]) -> None:
        for model in models:
            self._models[model.name].labels = dict(model.version_labels)

    def _raise_if_unavailable(self, names: list[str], timeout_s: float | None) -> None:
        """Wait until each model has an AVAILABLE version or all its loads failed."""
        deadline = time.monotonic() + (self.wait_s if timeout_s is None else timeout_s)
        with self._changed:
            while True:
                pending, failed = [], []
                for name in names:
                    if self._models[name].removed:
                        continue  # a newer config dropped it: nothing left to wait for
                    verdict = self._availability(name)
                    if verdict == "pending":
                        pending.append(name)
                    elif verdict != "ok":
                        failed.append(f"{name}: {verdict}")
                if not pending:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    # As TF Serving, a missing base path is waited for (it may yet appear),
                    # but the deadline's answer says what the wait was for.
                    why = [f"{n} ({self._models[n].missing})" if self._models[n].missing else n
                           for n in pending]  # fmt: skip
                    raise ServingError(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"models did not become available in time: {why}",
                    )
                self._changed.wait(timeout=min(left, 0.5))
        if failed:
            raise ServingError(
                grpc.StatusCode.UNKNOWN,
                f"{len(failed)} model(s) did not become available: {{{', '.join(failed)}}}",
            )

    def _availability(self, name: str) -> str:
        state = self._models[name]
        statuses = list(state.versions.values())
        if any(s.state == vs.AVAILABLE for s in statuses):
            return "ok"
        if statuses and all(s.state == vs.END for s in statuses) and state.failed:
            errors = [s.error.message for s in statuses if s.error is not None]
            return errors[0] if errors else "failed"
        return "pending"

    # ---- polling -------------------------------------------------------------------------
    def start_polling(self, interval_s: float) -> None:
        """Poll every ``interval_s`` seconds in a daemon thread (0: never again; <0: never)."""
        if interval_s <= 0:
            return

        def loop() -> None:
            while not self._stop.is_set():
                self._wake.wait(interval_s)
                self._wake.clear()
                if self._stop.is_set():
                    break
                try:
                    self.poll_once()
                except Exception:  # a poll must never kill the thread
                    log.exception("file-system poll failed")

        self._thread = threading.Thread(target=loop, name="fs-poll", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run the next poll now."""
        self._wake.set()

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def poll_once(self) -> None:
        """List every base path and load/unload versions to match the aspired sets."""
        with self._poll_lock:
            with self._lock:
                names = list(self._models)
            for name in names:
                self._poll_model(name)

    def _poll_model(self, name: str) -> None:
        with self._lock:
            state = self._models[name]
            config, removed = state.config, state.removed
        if removed:
            aspired: set[int] = set()
            on_disk: dict[int, str] = {}
        else:
            listing = vs.list_version_dirs(config.base_path)
            with self._lock:
                state.missing = (
                    None
                    if listing is not None
                    else f"Could not find base path {config.base_path} for servable {name}"
                )
                self._changed.notify_all()
            if listing is None:
                log.warning("%s", state.missing)
                return  # loaded versions are kept while the base path is missing
            if not listing:
                log.warning(
                    "No versions of servable %s found under base path %s. Did you forget "
                    "to name your leaf directory as a number (eg. '/1/')?",
                    name,
                    config.base_path,
                )
            on_disk = listing
            aspired = vs.aspired_versions(config.model_version_policy, listing)
        with self._lock:
            state.failed &= aspired  # a failed version that went away gets a fresh try later
            busy = {v for v, s in state.versions.items() if s.state in (vs.LOADING, vs.AVAILABLE)}
            to_load = sorted(aspired - busy - state.failed, reverse=True)
            for version in to_load:
                self._publish(state, VersionStatus(version, vs.START))
        for version in to_load:
            self._load(name, state, version, Path(on_disk[version]))
        with self._lock:
            ready = {v for v, s in state.versions.items() if s.state == vs.AVAILABLE}
            doomed = sorted(ready) if removed else vs.versions_to_unload(ready, aspired)
            for version in doomed:
                self._publish(state, VersionStatus(version, vs.UNLOADING))
            for version in doomed:
                # In-flight requests hold their own reference; dropping ours frees it after them.
                self._publish(state, VersionStatus(version, vs.END))
                log.info("Unloaded %s version %d", name, version)

    def _load(self, name: str, state: ModelState, version: int, path: Path) -> None:
        with self._lock:
            self._publish(state, VersionStatus(version, vs.LOADING))
        started = time.perf_counter()
        try:
            servable = self._loader(path)
        except Exception as exc:
            error = exc if isinstance(exc, ServingError) else _load_error(exc, path)
            log.error("Loading %s version %d failed: %s", name, version, error.message)
            with self._lock:
                state.failed.add(version)
                self._publish(state, VersionStatus(version, vs.END, error=error))
            return
        log.info("Loaded %s version %d in %.2fs", name, version, time.perf_counter() - started)
        with self._lock:
            self._publish(state, VersionStatus(version, vs.AVAILABLE, servable=servable))

    def _publish(self, state: ModelState, status: VersionStatus) -> None:
        state.versions[status.version] = status
        self._changed.notify_all()

    # ---- lookups -------------------------------------------------------------------------
    def servable(
        self, name: str, version: int | None = None, label: str | None = None
    ) -> LoadedVersion:
        """Return the servable a model spec names (latest AVAILABLE when no version/label)."""
        if not name:
            raise invalid("ModelSpec has no name specified.")
        with self._lock:
            state = self._models.get(name)
            if label is not None:
                labels = state.labels if state is not None and not state.removed else {}
                if label not in labels:
                    raise invalid(f"Unrecognized servable version label: {label}")
                version = labels[label]
            if state is None or state.removed:
                raise not_found(_request_text(name, version))
            if version is not None:
                status = state.versions.get(version)
                if status is None or status.servable is None:
                    raise not_found(_request_text(name, version))
                return status.servable
            ready = [s for s in state.versions.values() if s.servable is not None]
            if not ready:
                raise not_found(_request_text(name, None))
            return max(ready, key=lambda s: s.version).servable  # type: ignore[return-value]

    def status(self, name: str, version: int | None = None) -> list[VersionStatus]:
        """Return version statuses newest first; NOT_FOUND as GetModelStatus words it."""
        if not name:
            raise invalid("ModelSpec has no name specified.")
        with self._lock:
            state = self._models.get(name)
            statuses = [] if state is None else list(state.versions.values())
        if not statuses:
            raise not_found(f"Could not find any versions of model {name}")
        if version is not None:
            statuses = [s for s in statuses if s.version == version]
            if not statuses:
                raise not_found(f"Could not find version {version} of model {name}")
        return sorted(statuses, key=lambda s: s.version, reverse=True)

    def model_names(self) -> list[str]:
        """Return the names of the models in the current config."""
        with self._lock:
            return [n for n, s in self._models.items() if not s.removed]


def _request_text(name: str, version: int | None) -> str:
    if version is None:
        return f"Servable not found for request: Latest({name})"
    return f"Servable not found for request: Specific({name}, {version})"


def _load_error(exc: Exception, path: Path) -> ServingError:
    if not (path / "saved_model.pb").exists() and not (path / "saved_model.pbtxt").exists():
        return not_found(
            "Could not find SavedModel .pb or .pbtxt at supplied export directory path: "
            f"{path}. Check that the directory exists and that you have the right permissions "
            "for accessing it."
        )
    code = getattr(exc, "error_code", None)
    message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
    if isinstance(code, int):
        from modelserver.errors import code_from_number

        return ServingError(code_from_number(code), message)
    return ServingError(grpc.StatusCode.UNKNOWN, message)

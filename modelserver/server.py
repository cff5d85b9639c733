"""Assemble and run the server: initial load first, then the gRPC and REST ports, then polling."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from modelserver import config as cfg
from modelserver.batching import Batcher
from modelserver.core import Core
from modelserver.errors import ServingError
from modelserver.flags import Flags
from modelserver.grpc_service import build_grpc_server
from modelserver.loading import on_load_thread
from modelserver.manager import ModelManager
from modelserver.metrics import LOAD_ATTEMPT_COUNT, LOAD_LATENCY, WARMUP_LATENCY, Metrics
from modelserver.rest_server import RestApi, build_rest_server
from modelserver.servable import LoadedVersion
from modelserver.warmup import run_warmup

log = logging.getLogger("modelserver")
DRAIN_S = 5.0  # how long SIGTERM waits for in-flight requests


class StartupError(RuntimeError):
    """The server cannot start (bad flags or config, initial load failed)."""


def initial_config(flags: Flags) -> Any:
    """Return the ModelServerConfig from --model_config_file or --model_name/--model_base_path."""
    if flags.model_config_file:
        try:
            return cfg.read_model_server_config(flags.model_config_file)
        except (OSError, ServingError) as exc:
            raise StartupError(str(getattr(exc, "message", exc))) from None
    if not flags.model_base_path:
        raise StartupError(
            "Both server_options.model_base_path and server_options.model_config_file are empty!"
        )
    return cfg.single_model_config(flags.model_name, flags.model_base_path)


def make_loader(
    flags: Flags, metrics: Metrics, serving: threading.Event, sleep: Any = time.sleep
) -> Any:
    """Return the version loader: load, replay warmup (a failure fails the load), count.

    Warmup is paced at --warmup_duty_cycle only once ``serving`` is set: its pauses hand the
    intra-op pool to queued requests, and before the ports open there are none (the initial
    load replays back to back, as the binary does; MiniLM's 27 records took twice as long).
    """

    def load(path: Path) -> LoadedVersion:
        return on_load_thread(lambda: load_here(path), flags.load_nice, name=f"load-{path.name}")

    def load_here(path: Path) -> LoadedVersion:
        started = time.perf_counter()
        try:
            servable = LoadedVersion(path)
        except Exception:
            metrics.inc(LOAD_ATTEMPT_COUNT, (("model_path", str(path)), ("status", "fail")))
            raise
        metrics.inc(LOAD_ATTEMPT_COUNT, (("model_path", str(path)), ("status", "success")))
        metrics.observe(
            LOAD_LATENCY, (("model_path", str(path)),), (time.perf_counter() - started) * 1e6
        )
        if flags.enable_model_warmup:
            warm_start = time.perf_counter()
            duty = flags.warmup_duty_cycle if serving.is_set() else 1.0
            run_warmup(servable, flags.num_request_iterations_for_warmup, duty, sleep)
            metrics.observe(
                WARMUP_LATENCY,
                (("model_path", str(path)), ("status", "OK")),
                (time.perf_counter() - warm_start) * 1e6,
            )
        return servable

    return load


def _start_tf(flags: Flags) -> None:
    """Apply --tensorflow_{intra,inter}_op_parallelism (0: TF's choice), then start TensorFlow.

    Started here, on the main thread at normal priority: a thread inherits its creator's nice
    value, and loads run on threads lowered by --load_nice (``modelserver.loading``), so pools
    TensorFlow made during the first load would serve every request at the load's priority.
    """
    import tensorflow as tf

    if flags.tensorflow_intra_op_parallelism:
        tf.config.threading.set_intra_op_parallelism_threads(flags.tensorflow_intra_op_parallelism)
    if flags.tensorflow_inter_op_parallelism:
        tf.config.threading.set_inter_op_parallelism_threads(flags.tensorflow_inter_op_parallelism)
    square = tf.ones([8, 8])
    tf.function(lambda: tf.reduce_sum(square @ square))()  # the intra- and inter-op pools


class ModelServer:
    """The running server: manager, core, listeners and the config-file poller."""

    def __init__(self, flags: Flags) -> None:
        self.flags = flags
        if flags.batching_parameters_file and not flags.enable_batching:
            raise StartupError(
                "server_options.batching_parameters_file is set without setting "
                "server_options.enable_batching to true."
            )
        self.config = initial_config(flags)
        self.metrics = Metrics()
        batcher = None
        if flags.enable_batching:
            params = cfg.BatchingParameters()
            if flags.batching_parameters_file:
                params = self._read(cfg.read_batching_parameters, flags.batching_parameters_file)
            batcher = Batcher(self._checked(cfg.batching_settings, params), self.metrics)
        self.monitoring_path: str | None = None
        if flags.monitoring_config_file:
            monitoring = self._read(cfg.read_monitoring_config, flags.monitoring_config_file)
            if monitoring.prometheus_config.enable:
                self.monitoring_path = (
                    monitoring.prometheus_config.path or cfg.PROMETHEUS_DEFAULT_PATH
                )
        # Set once the initial load is done and the ports open: loads from then on are paced.
        self.serving = threading.Event()
        self.manager = ModelManager(
            make_loader(flags, self.metrics, self.serving),
            flags.allow_version_labels_for_unavailable_models,
        )
        self.core = Core(self.manager, self.metrics, batcher, flags.rest_api_num_threads)
        self._reload_lock = threading.Lock()
        self._polled_reload: Any = None  # the config file's content a reload is applying
        self._stopped = threading.Event()
        self._servers: list[Any] = []
        self._grpc_done: list[threading.Event] = []
        self._rest_api: RestApi | None = None

    @staticmethod
    def _read(reader: Any, path: str) -> Any:
        try:
            return reader(path)
        except (OSError, ServingError) as exc:
            raise StartupError(str(getattr(exc, "message", exc))) from None

    @staticmethod
    def _checked(fn: Any, value: Any) -> Any:
        try:
            return fn(value)
        except ServingError as exc:
            raise StartupError(exc.message) from None

    def reload(self, config: Any, timeout_s: float | None = None) -> None:
        """Apply a new ModelServerConfig (HandleReloadConfigRequest and config-file polling).

        The wait for added models holds no lock: a model stuck loading fails its own reload at
        the deadline, and a later reload goes ahead meanwhile.
        """
        self.manager.wake()
        self.manager.apply_config(config, initial=False, timeout_s=timeout_s)
        with self._reload_lock:
            if self.manager.config is config:  # not replaced by a newer reload meanwhile
                self.config = config

    def start(self) -> None:
        """Load the initial models, then open the ports (clients see refused, not 404, before)."""
        for name in self.flags.ignored:
            log.warning("--%s is accepted for compatibility and has no effect here", name)
        _start_tf(self.flags)
        self.manager.start_polling(self.flags.file_system_poll_wait_seconds)
        try:
            self.manager.apply_config(self.config, initial=True)
        except ServingError as exc:
            raise StartupError(exc.message) from None
        self.serving.set()
        grpc_server = build_grpc_server(
            self.core,
            self.flags.port,
            self.flags.grpc_max_threads,
            self.reload,
            self.flags.enable_serialization_as_tensor_content,
        )
        grpc_server.start()
        self._servers.append(grpc_server)
        log.info("Running gRPC ModelServer at 0.0.0.0:%d ...", self.flags.port)
        if self.flags.rest_api_port and self.flags.rest_api_port != self.flags.port:
            timeout_s = self.flags.rest_api_timeout_in_ms / 1000
            cors = self.flags.rest_api_enable_cors_support
            api = RestApi(
                self.core, timeout_s, self.monitoring_path, cors, self.flags.rest_api_num_threads
            )
            self._rest_api = api
            rest = build_rest_server(api, self.flags.rest_api_port)
            threading.Thread(target=rest.serve_forever, name="rest", daemon=True).start()
            self._servers.append(rest)
            log.info("Exporting HTTP/REST API at:localhost:%d ...", self.flags.rest_api_port)
        if self.flags.model_config_file and self.flags.model_config_file_poll_wait_seconds > 0:
            threading.Thread(target=self._poll_config_file, name="config-poll", daemon=True).start()

    def _poll_config_file(self) -> None:
        """Re-read --model_config_file every poll; reload when it differs from the config served.

        Each reload runs in its own thread, so one waiting for a model that never loads (up to
        the manager's bound) doesn't hold up the next edit of the file; a reload that failed is
        tried again at the next poll, as in the binary (labels may have become assignable).
        """
        wait = self.flags.model_config_file_poll_wait_seconds
        while not self._stopped.wait(wait):
            try:
                config = cfg.read_model_server_config(self.flags.model_config_file)
            except (OSError, ServingError) as exc:
                log.error("Failed to read ModelServerConfig file: %s", getattr(exc, "message", exc))
                continue
            with self._reload_lock:
                if config == self.config or config == self._polled_reload:
                    continue  # identical to the config served, or being applied now
                self._polled_reload = config
            threading.Thread(
                target=self._reload_polled, args=(config,), name="config-reload", daemon=True
            ).start()

    def _reload_polled(self, config: Any) -> None:
        try:
            self.reload(config)
        except ServingError as exc:
            log.error("PollFilesystemAndReloadConfig failed to ReloadConfig: %s", exc.message)
        finally:
            with self._reload_lock:
                if self._polled_reload is config:
                    self._polled_reload = None

    def wait(self) -> None:
        """Block until stop() (SIGTERM/SIGINT)."""
        # Wake up regularly: a signal delivered to another thread runs its Python handler only
        # when the main thread next executes bytecode.
        while not self._stopped.wait(0.25):
            pass

    def stop(self) -> None:
        """Stop accepting requests; in-flight ones keep running (see ``drain``)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        for server in self._servers:
            if hasattr(server, "shutdown"):
                threading.Thread(target=server.shutdown, daemon=True).start()
            else:
                self._grpc_done.append(server.stop(grace=DRAIN_S))
        self.manager.stop()

    def drain(self, timeout_s: float = DRAIN_S) -> None:
        """Wait (bounded) for in-flight gRPC and REST requests to finish, then stop helpers."""
        deadline = time.monotonic() + timeout_s
        for done in self._grpc_done:
            done.wait(max(0.0, deadline - time.monotonic()))
        while self._rest_api is not None and self._rest_api.in_flight:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.core.close()


def serve(flags: Flags) -> int:
    """Run the server until SIGTERM/SIGINT; return the exit status."""
    server: ModelServer | None = None
    try:
        server = ModelServer(flags)
        server.start()
    except (StartupError, OSError, RuntimeError) as exc:
        log.error("Failed to start server. Error: %s", exc)
        if server is not None:
            server.stop()
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    server.wait()
    server.drain()
    log.info("Server stopped")
    logging.shutdown()
    # Skip interpreter teardown: TF and gRPC worker threads can hold exit for seconds.
    os._exit(0)

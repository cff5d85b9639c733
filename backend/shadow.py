"""Shadow requests: a share of default traffic also goes to a version that never answers a client.

The client's answer never waits for the shadow: ``ShadowRunner.submit`` puts the job on a bounded
queue and returns (a full queue drops the shadow, counted as ``dropped``, never the client's
request; ``gateway_shadow_queue_depth`` counts the jobs queued or running); one daemon thread per
worker runs the jobs through the gateway's own request path and
compares the shadow's answer with the one the client got. Comparisons are by label *name*, not
index, so a version whose ``id2label`` swaps two labels disagrees exactly where it would mislead
a client; an embedder's answers compare per output kind (backend/outputs/: dense cosine,
sparse top-10 id overlap, multi-vector MaxSim agreement). Results go to the
``gateway_shadow_*`` metrics per (model, served version, shadow version), which the rollout
(``ops/rollout/``) reads.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from backend import metrics
from backend.errors import GatewayError
from backend.outputs import agreement as kind_agreement

log = logging.getLogger(__name__)

TOP_K = 3  # the top-k overlap measure compares the first 3 labels (or all, when fewer)


@dataclass(frozen=True)
class ShadowJob:
    """One request to repeat on ``shadow_version`` and compare with what ``served_version`` gave.

    ``run`` performs the shadow inference (the gateway's path, that version, a deadline) and
    returns (labels, outputs) of the shadow; ``labels``/``outputs`` are the served answer's.
    """

    model: str
    task: str
    served_version: int
    shadow_version: int
    labels: Sequence[str]
    outputs: dict[str, np.ndarray]
    run: Callable[[], tuple[Sequence[str], dict[str, np.ndarray]]]


def compare_classifications(
    served_labels: Sequence[str],
    served: np.ndarray,
    shadow_labels: Sequence[str],
    shadow: np.ndarray,
) -> dict[str, list[float]]:
    """Return per-text top1 agreement, top-k overlap and |Δ score| of the served top label.

    ``served``/``shadow`` are scores [texts, labels] in each version's own label order.
    """
    k = min(TOP_K, len(served_labels), len(shadow_labels))
    where = {name: i for i, name in enumerate(shadow_labels)}
    top1: list[float] = []
    overlap: list[float] = []
    delta: list[float] = []
    for row_s, row_h in zip(served, shadow, strict=True):
        order_s = np.argsort(-row_s, kind="stable")
        order_h = np.argsort(-row_h, kind="stable")
        best = served_labels[int(order_s[0])]
        top1.append(float(best == shadow_labels[int(order_h[0])]))
        names_s = {served_labels[int(i)] for i in order_s[:k]}
        names_h = {shadow_labels[int(i)] for i in order_h[:k]}
        overlap.append(len(names_s & names_h) / k if k else 0.0)
        index = where.get(best)
        other = float(row_h[index]) if index is not None else 0.0
        delta.append(abs(float(row_s[int(order_s[0])]) - other))
    return {"top1": top1, "topk_overlap": overlap, "score_delta": delta}


def compare_embeddings(served: np.ndarray, shadow: np.ndarray) -> dict[str, list[float]]:
    """Return the per-text cosine similarity of two versions' embeddings."""
    if served.shape != shadow.shape:
        return {"cosine": [0.0] * len(served)}  # another dimension: nothing in common
    norms = np.linalg.norm(served, axis=1) * np.linalg.norm(shadow, axis=1)
    cosine = np.sum(served * shadow, axis=1) / np.maximum(norms, 1e-12)
    return {"cosine": [float(c) for c in np.clip(cosine, -1.0, 1.0)]}


def compare_token_labels(
    served_labels: Sequence[str],
    served: np.ndarray,
    shadow_labels: Sequence[str],
    shadow: np.ndarray,
) -> dict[str, list[float]]:
    """Return per text the share of token positions whose top label (by name) is the same.

    Taggers' scores are [texts, tokens, labels]; another vocabulary gives other tokens, and then
    positions mean nothing: such a pair agrees on nothing.
    """
    if served.shape[:2] != shadow.shape[:2]:
        return {"tokens": [0.0] * len(served)}
    names_s = np.asarray(served_labels, dtype=object)[np.argmax(served, axis=-1)]
    names_h = np.asarray(shadow_labels, dtype=object)[np.argmax(shadow, axis=-1)]
    return {"tokens": [float(v) for v in np.mean(names_s == names_h, axis=1)]}


# The passthrough's shadow (task "tfs"): raw outputs agree when np.allclose holds with these.
RAW_RTOL = 1e-3
RAW_ATOL = 1e-5


def compare_raw(
    served: dict[str, np.ndarray], shadow: dict[str, np.ndarray]
) -> dict[str, list[float]]:
    """Return ``allclose``: per served output, 1.0 when the shadow's has its shape and
    ``np.allclose`` holds within RAW_RTOL/RAW_ATOL, else 0.0."""
    agree = []
    for name, array in served.items():
        other = shadow.get(name)
        same = other is not None and other.shape == array.shape
        close = same and bool(np.allclose(array, other, rtol=RAW_RTOL, atol=RAW_ATOL))  # type: ignore[arg-type]
        agree.append(float(close))
    return {"allclose": agree}


def compare(
    job: ShadowJob, labels: Sequence[str], outputs: dict[str, np.ndarray]
) -> dict[str, list[float]]:
    """Return the measures of ``job``'s served answer against the shadow's."""
    if job.task == "tfs":
        return compare_raw(job.outputs, outputs)
    if job.task == "embed":  # each output kind's own measure (backend/outputs/)
        return kind_agreement(job.outputs, outputs)
    if job.task == "tag":
        key = "probabilities" if "probabilities" in job.outputs else "logits"
        return compare_token_labels(job.labels, job.outputs[key], labels, outputs[key])
    key = "probabilities" if "probabilities" in job.outputs else "logits"
    return compare_classifications(job.labels, job.outputs[key], labels, outputs[key])


class ShadowRunner:
    """A bounded queue and one daemon thread per worker process that run and compare shadows."""

    def __init__(self, queue_size: int) -> None:
        # One job runs at a time (one thread); ``queue_size`` more may wait behind it. 0 keeps
        # the shadow to the worker's spare moments: a shadow arriving while one runs is dropped
        # (and counted) instead of piling work onto a busy model server.
        self._limit = queue_size + 1
        self._queue: queue.Queue[ShadowJob] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def submit(self, job: ShadowJob) -> bool:
        """Queue ``job`` without waiting; return False (and count it dropped) when full."""
        self._ensure_thread()
        with self._lock:
            # unfinished_tasks: queued + running (task_done comes after the run)
            if self._queue.unfinished_tasks >= self._limit:
                self._count(job, "dropped")
                return False
            # before the put: the thread may finish the job (and dec) at once
            metrics.child(metrics.SHADOW_QUEUE, job.model).inc()
            self._queue.put_nowait(job)
        return True

    def join(self, timeout_s: float) -> bool:
        """Wait until the queue is empty (tests, shutdown); return whether it emptied."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False

    def _ensure_thread(self) -> None:
        # After a fork the parent's thread is gone: start this process's own, once.
        if self._thread is not None and self._pid == os.getpid():
            return
        with self._lock:
            if self._thread is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, name="shadow", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        metrics.quiet_stages()
        while True:
            job = self._queue.get()
            try:
                self._run(job)
            except Exception:  # a shadow must never take the worker's thread down
                log.exception("shadow request for %s v%s failed", job.model, job.shadow_version)
            finally:
                metrics.child(metrics.SHADOW_QUEUE, job.model).dec()
                self._queue.task_done()

    def _run(self, job: ShadowJob) -> None:
        started = time.perf_counter()
        try:
            labels, outputs = job.run()
        except GatewayError as exc:
            self._count(job, "error")
            log.info("shadow %s v%s: %s", job.model, job.shadow_version, exc.message)
            return
        finally:
            self._child(metrics.SHADOW_SECONDS, job).observe(time.perf_counter() - started)
        measures = compare(job, labels, outputs)
        for measure, values in measures.items():
            if measure == "score_delta":
                histogram = self._child(metrics.SHADOW_SCORE_DELTA, job)
            else:
                histogram = self._child(metrics.SHADOW_AGREEMENT, job, measure)
            for value in values:
                histogram.observe(value)
        self._count(job, "compared")

    @staticmethod
    def _child(metric: Any, job: ShadowJob, *more: str) -> Any:
        return metrics.child(
            metric, job.model, str(job.served_version), str(job.shadow_version), *more
        )

    def _count(self, job: ShadowJob, outcome: str) -> None:
        self._child(metrics.SHADOW_REQUESTS, job, outcome).inc()

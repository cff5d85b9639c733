"""Server-side batching like TF Serving's BatchingSession over a shared batch scheduler.

Concurrent Predict calls for the same servable and signature queue up; batch threads merge a
batch's inputs along dimension 0 (padding variable-length dims when asked), run the model once,
and slice the outputs back to each caller.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from modelserver.errors import ServingError, invalid, unavailable
from modelserver.metrics import BATCH_SIZE, QUEUING_LATENCY, SIZE_BUCKETS, Metrics
from modelserver.servable import LoadedVersion, PredictPlan

QUEUE_FULL = "The batch scheduling queue to which this task was submitted is full"


@dataclass(eq=False)  # by identity: a withdrawn task must not be compared by its numpy inputs
class _Task:
    plan: PredictPlan
    size: int
    enqueued: float
    done: threading.Event = field(default_factory=threading.Event)
    outputs: dict[str, np.ndarray] | None = None
    error: ServingError | None = None


@dataclass(eq=False)
class _Batch:
    servable: LoadedVersion
    key: tuple[int, str, tuple[str, ...]]
    tasks: list[_Task] = field(default_factory=list)
    size: int = 0
    closed: bool = False
    started: bool = False  # popped by a batch thread: its tasks will run


def task_size(plan: PredictPlan) -> int:
    """Return the 0th-dimension size shared by a request's inputs."""
    sizes = set()
    for array in plan.inputs.values():
        if array.ndim == 0:
            raise invalid("Batching input tensors must have at least one dimension")
        sizes.add(array.shape[0])
    if len(sizes) != 1:
        raise invalid("Batching Run() input tensors must have equal 0th-dimension size")
    return sizes.pop()


def merge_inputs(tasks: list[_Task], padded_size: int, pad: bool) -> dict[str, np.ndarray]:
    """Return the batch's inputs: concatenated on dim 0, padded to ``padded_size`` rows."""
    merged: dict[str, np.ndarray] = {}
    for alias in tasks[0].plan.inputs:
        parts = [t.plan.inputs[alias] for t in tasks]
        tails = {p.shape[1:] for p in parts}
        if len(tails) > 1:
            if not pad or len({p.ndim for p in parts}) > 1:
                raise invalid(
                    f"Tensors with name '{alias}' from different tasks have different shapes and "
                    "padding is turned off. Set pad_variable_length_inputs to true, or ensure "
                    "that all tensors with the same name have equal dimensions starting with "
                    "the first dim."
                )
            target = tuple(max(dims) for dims in zip(*tails, strict=True))
            parts = [_pad_to(p, target) for p in parts]
        array = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
        extra = padded_size - array.shape[0]
        if extra > 0:  # allowed_batch_sizes: fill with copies of the first row
            array = np.concatenate([array, np.repeat(array[:1], extra, axis=0)], axis=0)
        merged[alias] = array
    return merged


def _pad_to(array: np.ndarray, target: tuple[int, ...]) -> np.ndarray:
    """Pad the non-batch dims of one task's tensor up to ``target``, as TF Serving does.

    TF Serving (batching_util.cc PadTensor) pads with the tensor's *first element*, not zero:
    for BERT inputs that is the [CLS] id and attention-mask 1, so padded rows change the
    model's output. Mirrored here so that the hazard shows up in development too.
    """
    if array.shape[1:] == target:
        return array
    if array.size == 0:
        raise invalid("Got empty tensor in batch of non-empty tensors.")
    widths = [(0, 0)] + [(0, t - s) for s, t in zip(array.shape[1:], target, strict=True)]
    return np.pad(array, widths, constant_values=array.flat[0])


class Batcher:
    """A shared scheduler: per-(servable, signature) queues served by ``num_batch_threads``."""

    def __init__(self, settings: dict[str, Any], metrics: Metrics | None = None) -> None:
        self.max_batch_size: int = settings["max_batch_size"]
        self.timeout_s: float = settings["batch_timeout_micros"] / 1e6
        self.max_enqueued: int = settings["max_enqueued_batches"]
        self.allowed: list[int] = settings["allowed_batch_sizes"]
        self.pad: bool = settings["pad_variable_length_inputs"]
        self.metrics = metrics
        self._cond = threading.Condition()
        self._queues: dict[tuple[int, str, tuple[str, ...]], deque[_Batch]] = {}
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._work, name=f"batch-{i}", daemon=True)
            for i in range(max(1, settings["num_batch_threads"]))
        ]
        for thread in self._threads:
            thread.start()

    def run(
        self, servable: LoadedVersion, plan: PredictPlan, timeout_s: float | None = None
    ) -> dict[str, np.ndarray]:
        """Enqueue a request, wait for its batch, return its slice of the outputs."""
        size = task_size(plan)
        if size > self.max_batch_size:
            raise invalid(
                f"Task size {size} is larger than maximum input batch size {self.max_batch_size}"
            )
        task = _Task(plan, size, time.monotonic())
        # Only calls that want the same outputs of the same signature can share a model call.
        key = (id(servable), plan.signature_name, tuple(plan.output_aliases))
        with self._cond:
            queue = self._queues.setdefault(key, deque())
            last = queue[-1] if queue else None
            if last is None or last.closed or last.size + size > self.max_batch_size:
                if last is not None:
                    last.closed = True
                if len(queue) >= self.max_enqueued:
                    raise unavailable(QUEUE_FULL)
                last = _Batch(servable, key)
                queue.append(last)
            last.tasks.append(task)
            last.size += size
            if last.size >= self.max_batch_size:
                last.closed = True
            self._cond.notify()
        if not task.done.wait(timeout_s):
            self._withdraw(last, task)
            raise ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        if task.error is not None:
            raise task.error
        assert task.outputs is not None
        return task.outputs

    def _withdraw(self, batch: _Batch, task: _Task) -> None:
        """Take a timed-out task out of its batch unless a batch thread already took the batch.

        Nobody waits for its answer any more, so running it would only delay the tasks queued
        behind it (a running one can't be interrupted: TF has no cancellation here).
        """
        with self._cond:
            if batch.started:
                return
            batch.tasks.remove(task)
            batch.size -= task.size
            if not batch.tasks:
                queue = self._queues.get(batch.key)
                if queue is not None and batch in queue:
                    queue.remove(batch)
                    if not queue:
                        del self._queues[batch.key]

    def _next_batch(self) -> _Batch | None:
        """Pop a batch that is full, closed or past its timeout; wait otherwise."""
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                wake_at = None
                for key, queue in list(self._queues.items()):
                    if not queue:
                        del self._queues[key]
                        continue
                    head = queue[0]
                    due = head.tasks[0].enqueued + self.timeout_s
                    if head.closed or due <= now:
                        queue.popleft()
                        head.closed = head.started = True
                        if not queue:
                            del self._queues[key]  # unloaded versions leave no queues behind
                        return head
                    wake_at = due if wake_at is None else min(wake_at, due)
                self._cond.wait(None if wake_at is None else max(0.0, wake_at - now))
        return None

    def _work(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._process(batch)

    def _process(self, batch: _Batch) -> None:
        tasks = batch.tasks
        padded = next((s for s in self.allowed if s >= batch.size), batch.size)
        try:
            inputs = merge_inputs(tasks, padded, self.pad)
            plan = tasks[0].plan
            merged = PredictPlan(plan.signature_name, inputs, plan.output_aliases)
            outputs = batch.servable.run(merged)
            for alias, array in outputs.items():
                if array.ndim == 0 or array.shape[0] != padded:
                    raise invalid(
                        "Batched output tensor's 0th dimension does not equal the sum of the "
                        f"0th dimension sizes of the input tensors (output {alias})"
                    )
            offset = 0
            for task in tasks:
                task.outputs = {a: o[offset : offset + task.size] for a, o in outputs.items()}
                offset += task.size
        except ServingError as exc:
            for task in tasks:
                task.error = exc
        except Exception as exc:  # never leave a caller waiting
            for task in tasks:
                task.error = ServingError(grpc.StatusCode.INTERNAL, str(exc))
        if self.metrics is not None:
            now = time.monotonic()
            self.metrics.observe(BATCH_SIZE, (), float(batch.size), SIZE_BUCKETS)
            for task in tasks:
                self.metrics.observe(QUEUING_LATENCY, (), (now - task.enqueued) * 1e6)
        for task in tasks:
            task.done.set()

    def close(self) -> None:
        """Stop the batch threads (queued callers get no answer; used at shutdown)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

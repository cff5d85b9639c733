"""The training loop: Keras AdamW (warmup + linear decay), dropout, early stopping, resume.

A custom loop over export's ``tf.Module`` rather than ``Model.fit``: Keras 3 tracks only its own
variables, and the point is to train the exact module export serves. What Keras provides is used
as is: the optimizer and its schedule, the loss-scale optimizer, the mixed-precision policy
(finetune/precision.py) and the progress bar.

Resume: the model, the optimizer (slots, step, loss scale), the epoch and the step within it are
saved with ``tf.train.CheckpointManager`` under the run's state directory every
``save_every_steps`` and at each epoch end; the best epoch's weights separately. Shuffling (per
epoch seed) and dropout (stateless, seeded by the optimizer step) are functions of the seed and
the step, so a resumed run sees the batches and masks the killed one would have.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from backend.tokenization import TextTokenizer
from finetune.pipeline import (
    bucketed_batches,
    naive_batches,
    optimised_dataset,
    sorted_batches,
    token_ids,
)
from finetune.precision import TrainingPrecision

Say = Callable[[str], None]
HISTORY = "history.json"


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters and loop settings of one run."""

    epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 5e-5
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    seed: int = 13
    patience: int = 2  # epochs without a better dev accuracy before stopping
    pipeline: str = "optimised"
    save_every_steps: int = 50
    verbose: bool = True  # the progress bar


@dataclass
class Split:
    """One data split, tokenized: texts, label ids and (for the optimised pipeline) token ids.

    The other heads add: ``types`` (sentence pairs' token types), ``targets`` (multi-label
    ``[rows, labels]`` floats, or tagging's per-token label ids), ``examples`` (what was read),
    ``words`` (tagging: each row's words, to read entities back) and ``truncated`` (rows cut).
    """

    texts: list[str]
    label_ids: list[int]
    ids: list[np.ndarray] = field(default_factory=list)
    dataset: Any = None  # the cached tf.data examples, built on first use
    types: list[np.ndarray] | None = None
    targets: Any = None
    examples: Any = None
    words: list[Any] = field(default_factory=list)
    truncated: int = 0


@dataclass
class TrainOutcome:
    """What a run produced: per-epoch history, the best epoch, steps and timings."""

    history: list[dict[str, Any]]
    best_epoch: int
    best_dev_accuracy: float
    steps: int
    stopped_early: bool


def warmup_linear_decay(peak: float, warmup_steps: int, total_steps: int) -> Any:
    """Return a Keras schedule: linear warmup to ``peak``, then linear decay to 0."""
    import keras
    import tensorflow as tf

    class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step: Any) -> Any:
            step = tf.cast(step, tf.float32)
            warm = step / max(warmup_steps, 1)
            decay = (total_steps - step) / max(total_steps - warmup_steps, 1)
            return peak * tf.maximum(0.0, tf.minimum(warm, decay))

        def get_config(self) -> dict[str, Any]:
            return {"peak": peak, "warmup_steps": warmup_steps, "total_steps": total_steps}

    return WarmupLinearDecay()


def make_optimizer(config: TrainConfig, total_steps: int, precision: TrainingPrecision) -> Any:
    """Return AdamW on the warmup/decay schedule (loss-scaled under ``mixed_float16``)."""
    import keras

    schedule = warmup_linear_decay(
        config.learning_rate, int(total_steps * config.warmup_fraction), total_steps
    )
    optimizer = keras.optimizers.AdamW(
        learning_rate=schedule, weight_decay=config.weight_decay, global_clipnorm=config.clip_norm
    )
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])  # as BERT does
    if precision.loss_scaling:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


class Trainer:
    """Trains a ``EncoderModule`` on tokenized splits; state lives under ``state_dir``.

    ``task`` (a finetune/tasks.py ``Task``; single-label classification is ``Task(TaskOptions())``)
    gives the loss, the targets and the dev figure that picks the best epoch.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: TextTokenizer,
        config: TrainConfig,
        precision: TrainingPrecision,
        state_dir: Path,
        say: Say,
        task: Any,
    ) -> None:
        import tensorflow as tf

        self.task = task
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.state_dir, self.say = state_dir, say
        self.precision = precision
        self.variables = list(model.trainable_variables)
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.best_accuracy = tf.Variable(-1.0, dtype=tf.float64, trainable=False)
        self.best_epoch = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self.bad_epochs = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.optimizer: Any = None
        spec = tf.TensorSpec([None, None], tf.int32)
        # one trace for every bucket length; no data-dependent Python control flow to convert
        self.train_step = tf.function(
            self._step,
            input_signature=[spec, spec, spec, task.target_spec()],
            autograph=False,
        )
        self._predict = tf.function(
            lambda ids, mask, types: tf.argmax(model.logits(ids, mask, types), -1, tf.int32),
            input_signature=[spec, spec, spec],
            autograph=False,
        )
        self._logits = tf.function(
            lambda ids, mask, types: tf.cast(model.logits(ids, mask, types), tf.float32),
            input_signature=[spec, spec, spec],
            autograph=False,
        )

    # -- batches ---------------------------------------------------------------------------
    def batches(self, split: Split, epoch: int | None, skip: int = 0) -> Iterable[Any]:
        """Return the split's batches (``epoch`` None: in order, for evaluation)."""
        seed = None if epoch is None else self.config.seed + epoch
        if self.config.pipeline == "naive":
            return naive_batches(
                self.tokenizer, split.texts, split.label_ids, self.config.batch_size,
                seed=seed, skip=skip,
            )  # fmt: skip
        if split.dataset is None:
            split.dataset = optimised_dataset(
                split.ids, self.task.targets(split), split.types,
                per_token=self.task.model_task == "tag",
            )  # fmt: skip
        return bucketed_batches(
            split.dataset, self.config.batch_size, self.tokenizer.max_seq_len,
            self.tokenizer.pad_id, seed=seed, skip=skip, label_pad=self.task.label_pad,
        )  # fmt: skip

    def steps_per_epoch(self, split: Split) -> int:
        """Return the number of training batches in one epoch (bucketing adds partial ones)."""
        if self.config.pipeline == "naive":
            return math.ceil(len(split.texts) / self.config.batch_size)
        return sum(1 for _ in self.batches(split, epoch=0))

    # -- steps -----------------------------------------------------------------------------
    def prepare(self, total_steps: int) -> None:
        """Create the optimizer for a run of ``total_steps`` (before ``train_step``)."""
        self.optimizer = make_optimizer(self.config, total_steps, self.precision)
        self.optimizer.build(self.variables)

    def _step(self, ids: Any, mask: Any, types: Any, labels: Any) -> Any:
        import tensorflow as tf

        step = tf.cast(tf.convert_to_tensor(self.optimizer.iterations), tf.int32)
        dropout_seed = tf.stack([step, tf.constant(self.config.seed, tf.int32)])
        with tf.GradientTape() as tape:
            logits = tf.cast(self.model.logits(ids, mask, types, dropout_seed), tf.float32)
            loss = self.task.loss(logits, labels)
            scaled = self.optimizer.scale_loss(loss)  # identity unless loss-scaled (fp16)
        grads = tape.gradient(scaled, self.variables)
        self.optimizer.apply(grads, self.variables)
        return loss

    def predict(self, split: Split) -> tuple[list[int], list[int]]:
        """Return (true label ids, predicted label ids) over a split, in batch order."""
        truth: list[int] = []
        predicted: list[int] = []
        for inputs, labels in self.batches(split, epoch=None):
            out = self._predict(inputs["input_ids"], inputs["attention_mask"],
                                inputs["token_type_ids"])  # fmt: skip
            truth += np.asarray(labels).tolist()
            predicted += out.numpy().tolist()
        return truth, predicted

    def accuracy(self, split: Split) -> float:
        """Return the model's accuracy on ``split``."""
        truth, predicted = self.predict(split)
        return float(np.mean(np.asarray(truth) == np.asarray(predicted))) if truth else 0.0

    def logits(self, split: Split) -> list[np.ndarray]:
        """Return each row's float32 logits in file order (``[labels]``, or ``[tokens, labels]``
        for a tag head, cut to the row's length); batches sorted by length and bucket-padded."""
        rows = split.ids or [e.ids for e in self.tokenizer.encode(split.texts)]
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(rows)
        for chunk, feeds in sorted_batches(rows, self.config.batch_size,
                                           self.tokenizer.max_seq_len, self.tokenizer.pad_id,
                                           split.types):  # fmt: skip
            logits = self._logits(feeds["input_ids"], feeds["attention_mask"],
                                  feeds["token_type_ids"]).numpy()  # fmt: skip
            for j, i in enumerate(chunk):
                out[i] = logits[j, : len(rows[i])] if logits.ndim == 3 else logits[j]
        return out

    def dev_score(self, split: Split) -> float:
        """Return the figure that picks the best epoch: accuracy, or the task's own."""
        if self.task.name == "classify":
            return self.accuracy(split)
        return self.task.dev_score(split, self.logits(split))

    # -- state -----------------------------------------------------------------------------
    def _managers(self) -> tuple[Any, Any, Any]:
        import tensorflow as tf

        last = tf.train.Checkpoint(
            model=self.model, optimizer=self.optimizer, epoch=self.epoch,
            step_in_epoch=self.step_in_epoch, best_accuracy=self.best_accuracy,
            best_epoch=self.best_epoch, bad_epochs=self.bad_epochs,
        )  # fmt: skip
        best = tf.train.Checkpoint(model=self.model)
        return (
            tf.train.CheckpointManager(last, str(self.state_dir / "last"), max_to_keep=1),
            best,
            tf.train.CheckpointManager(best, str(self.state_dir / "best"), max_to_keep=1),
        )

    def _history(self) -> dict[str, dict[str, Any]]:
        path = self.state_dir / HISTORY
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    def _write_history(self, history: dict[str, dict[str, Any]]) -> None:
        path = self.state_dir / HISTORY
        temp = path.with_suffix(".tmp")
        temp.write_text(json.dumps(history, indent=2), encoding="utf-8")
        os.replace(temp, path)

    # -- the loop --------------------------------------------------------------------------
    def fit(self, train: Split, dev: Split, on_step: Callable[[int], None] | None = None
            ) -> TrainOutcome:  # fmt: skip
        """Train (resuming from ``state_dir`` if it holds a checkpoint); restore the best epoch."""
        import keras

        config = self.config
        per_epoch = self.steps_per_epoch(train)
        self.prepare(per_epoch * config.epochs)
        last, best, best_manager = self._managers()
        if last.latest_checkpoint:
            last.checkpoint.restore(last.latest_checkpoint).assert_existing_objects_matched()
            self.say(
                f"resuming from {last.latest_checkpoint}: epoch {int(self.epoch) + 1}, "
                f"step {int(self.step_in_epoch)} of {per_epoch}"
            )
        history = self._history()
        stopped_early = int(self.bad_epochs) >= config.patience
        while int(self.epoch) < config.epochs and not stopped_early:
            epoch = int(self.epoch)
            self.say(f"epoch {epoch + 1}/{config.epochs}")
            bar = keras.utils.Progbar(per_epoch, stateful_metrics=["examples/s"],
                                      verbose=1 if config.verbose else 0)  # fmt: skip
            started, seen = time.perf_counter(), 0
            done = int(self.step_in_epoch)
            for inputs, labels in self.batches(train, epoch, skip=done):
                loss = self.train_step(inputs["input_ids"], inputs["attention_mask"],
                                        inputs["token_type_ids"], labels)  # fmt: skip
                done += 1
                seen += int(np.shape(labels)[0])
                self.step_in_epoch.assign(done)
                rate = seen / max(time.perf_counter() - started, 1e-9)
                bar.update(min(done, per_epoch), [("loss", float(loss)), ("examples/s", rate)])
                if done % config.save_every_steps == 0:
                    last.save()
                if on_step is not None:
                    on_step(int(self.optimizer.iterations))
            wall = time.perf_counter() - started
            dev_accuracy = self.dev_score(dev)
            improved = dev_accuracy > float(self.best_accuracy)
            if improved:
                self.best_accuracy.assign(dev_accuracy)
                self.best_epoch.assign(epoch)
                self.bad_epochs.assign(0)
                best_manager.save()
            else:
                self.bad_epochs.assign_add(1)
            history[str(epoch)] = {
                "epoch": epoch + 1, f"dev_{self.task.selection}": dev_accuracy,
                "train_wall_s": wall, "examples_per_s": seen / max(wall, 1e-9), "steps": done,
            }  # fmt: skip
            self.say(
                f"epoch {epoch + 1}: dev {self.task.selection} {dev_accuracy:.4f}"
                f"{' (best)' if improved else ''}, {wall:.1f}s, "
                f"{seen / max(wall, 1e-9):.1f} examples/s"
            )
            self._write_history(history)
            self.epoch.assign_add(1)
            self.step_in_epoch.assign(0)
            last.save()
            stopped_early = int(self.bad_epochs) >= config.patience
            if stopped_early and int(self.epoch) < config.epochs:
                self.say(f"early stop: no better dev {self.task.selection} for {config.patience} "
                         "epochs")  # fmt: skip
        best.restore(best_manager.latest_checkpoint).assert_existing_objects_matched()
        return TrainOutcome(
            history=[history[k] for k in sorted(history, key=int)],
            best_epoch=int(self.best_epoch) + 1,
            best_dev_accuracy=float(self.best_accuracy),
            steps=int(self.optimizer.iterations),
            stopped_early=stopped_early and int(self.epoch) < config.epochs,
        )


def tokenize_split(
    tokenizer: TextTokenizer, texts: Sequence[str], label_ids: Sequence[int], pipeline: str
) -> Split:
    """Return a split, pre-tokenized when the pipeline is ``optimised``."""
    ids = token_ids(tokenizer, texts) if pipeline == "optimised" else []
    return Split(texts=list(texts), label_ids=list(label_ids), ids=ids)

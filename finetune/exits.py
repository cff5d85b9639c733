"""Self-distillation of early-exit students (FastBERT): ``python -m finetune distill-exits``.

The backbone and the checkpoint's trained head (the teacher) stay frozen. One student per layer
1..L-1 (export/model.py's ``Student``: pooled hidden state → dense H→W tanh → classifier W→N) learns
to match the teacher's softmax (KL(teacher ‖ student), summed over students) on texts whose
labels are not needed. Students read only a pooled vector, so every layer's pooled vectors and
the teacher's probabilities are computed once (length-bucketed batches, the gateway's tokenizer)
and the students train on those cached vectors: seconds, not minutes.

The output is the input checkpoint plus the students (finetune/output.py's publish rule):
``model.safetensors`` gains ``exits.{k}.*`` (transformers ignores them), ``config.json`` an
``early_exits`` entry (with the speed calibration fitted on the dev set, finetune/calibration.py),
and ``exits.json`` holds the full report.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from export.checkpoint import Checkpoint, read_checkpoint
from finetune.calibration import calibration_table, config_entry, shown
from finetune.data import Texts, read_texts
from finetune.errors import FinetuneError
from finetune.output import hf_tensors, publishing
from finetune.training import Say

POOLINGS = ("mean", "cls")
EXITS_JSON = "exits.json"
INIT_STD = 0.02  # BERT's initializer_range
ENCODE_BATCH = 64


@dataclass(frozen=True)
class DistillConfig:
    """Settings of one distillation run (``pooling`` "auto": train both, keep the better).

    ``mean`` is the default because it won where measured (finetune/README.md: MiniLM on the
    tickets, dev agreement 0.94 against 0.58 for ``cls``, whose early layers' [CLS] says little).
    """

    pooling: str = "mean"
    width: int = 128
    epochs: int = 30
    learning_rate: float = 2e-3
    batch_size: int = 32
    weight_decay: float = 0.01
    seed: int = 13
    max_seq_len: int | None = None  # None: the checkpoint's finetune_max_seq_len, else 128


@dataclass(frozen=True)
class Features:
    """Cached per text: each pooling's vectors after layers 1..L-1 and the teacher's logits."""

    pooled: dict[str, np.ndarray]  # pooling -> [L-1, n, H] float32
    teacher: np.ndarray  # [n, N] float32 logits


@dataclass(frozen=True)
class DistillResult:
    """The published checkpoint and its exits.json report."""

    out: Path
    report: dict[str, Any]

    def table(self) -> str:
        """Return the per-layer report as a markdown table."""
        labelled = self.report["dev"]["labelled"]
        lines = ["| exit layer | agreement | accuracy | mean entropy |", "|---|---:|---:|---:|"]
        for row in self.report["per_layer"]:
            name = f"{row['layer']} (teacher)" if row.get("teacher") else str(row["layer"])
            accuracy = f"{row['accuracy']:.3f}" if labelled else "-"
            lines.append(f"| {name} | {row['agreement']:.3f} | {accuracy} | "
                         f"{row['mean_entropy']:.3f} |")  # fmt: skip
        return "\n".join(lines)

    def summary(self) -> str:
        """Return the one-line summary the CLI prints last."""
        r = self.report
        return (f"wrote {self.out} ({len(r['layers'])} students, {r['pooling']} pooling, "
                f"width {r['width']}, {r['texts']} texts, {r['wall_s']:.1f}s)")  # fmt: skip


def _check_settings(config: DistillConfig) -> None:
    if config.pooling not in ("auto", *POOLINGS):
        raise FinetuneError(f"pooling must be auto, mean or cls, got {config.pooling!r}")
    for name, value in (("epochs", config.epochs), ("batch size", config.batch_size),
                        ("width", config.width)):  # fmt: skip
        if value < 1:
            raise FinetuneError(f"{name} must be at least 1, got {value}")
    if not 0 < config.learning_rate < 1:
        raise FinetuneError(f"learning rate must be in (0, 1), got {config.learning_rate}")


def _check_teacher(ckpt: Checkpoint, path: Path) -> None:
    """Refuse checkpoints that cannot teach: not HF, no trained head, < 2 labels, 1 layer."""
    if ckpt.source.get("format") != "hf":
        raise FinetuneError(f"{path}: distill-exits takes a Hugging Face checkpoint directory")
    if not ckpt.has_head or "pooler/kernel" not in ckpt.weights:
        raise FinetuneError(
            f"{path} has no trained classifier head (pooler + classifier) to distil from; "
            "fine-tune it first (python -m finetune)"
        )
    if len(ckpt.labels) < 2:
        raise FinetuneError(f"{path}: the head has {len(ckpt.labels)} label(s); need at least 2")
    if ckpt.config.num_layers < 2:
        raise FinetuneError(f"{path}: a 1-layer model has no layer to exit after")


def _read_dev(path: Path, labels: Sequence[str]) -> Texts:
    dev = read_texts(path)
    if not dev.texts:
        raise FinetuneError(f"{path}: the dev set has no texts")
    unknown = sorted(set(dev.labels or ()) - set(labels))
    if unknown:
        raise FinetuneError(f"{path}: labels {unknown} are not the checkpoint's {list(labels)}")
    return dev


def encode(
    ckpt: Checkpoint, texts: Sequence[str], max_seq_len: int, poolings: Sequence[str] = POOLINGS
) -> Features:
    """Return every layer's pooled vectors (for ``poolings`` only) and the teacher's logits,
    once. Each pooling costs [L-1, n, H] float32: 3.4 GB for BERT-base on 100k texts, so a run
    with one pooling caches one."""
    import tensorflow as tf

    from export.model import EncoderModule, pool
    from finetune.pipeline import checkpoint_tokenizer, sorted_batches, token_ids

    module = EncoderModule(ckpt.config, ckpt.weights, task="classify", pooling="cls")

    def forward(ids: tf.Tensor, mask: tf.Tensor, types: tf.Tensor) -> Any:
        hidden = module.layer_outputs(ids, mask, types)
        pooled = {p: tf.stack([pool(h, mask, p) for h in hidden[:-1]]) for p in poolings}
        # the served head on the last layer, exactly: the students' target
        return pooled, module.head(hidden[-1], attention_mask=mask)

    spec = tf.TensorSpec([None, None], tf.int32)
    run = tf.function(forward, input_signature=[spec] * 3, autograph=False)
    tokenizer = checkpoint_tokenizer(ckpt, max_seq_len)
    rows = token_ids(tokenizer, texts)
    layers, hidden = ckpt.config.num_layers - 1, ckpt.config.hidden_size
    pooled = {p: np.zeros((layers, len(rows), hidden), np.float32) for p in poolings}
    teacher = np.zeros((len(rows), len(ckpt.labels)), np.float32)
    for chunk, feeds in sorted_batches(rows, ENCODE_BATCH, max_seq_len, tokenizer.pad_id):
        vectors, logits = run(feeds["input_ids"], feeds["attention_mask"],
                              feeds["token_type_ids"])  # fmt: skip
        for p in poolings:
            pooled[p][:, chunk] = vectors[p].numpy()
        teacher[chunk] = logits.numpy()
    return Features(pooled=pooled, teacher=teacher)


def initial_students(layers: int, hidden: int, width: int, labels: int, seed: int) -> list[dict]:
    """Return untrained student weights (σ 0.02 kernels, zero biases), one dict per exit."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0.0, INIT_STD, shape).astype(np.float32)

    return [
        {"dense/kernel": normal(hidden, width), "dense/bias": np.zeros(width, np.float32),
         "classifier/kernel": normal(width, labels),
         "classifier/bias": np.zeros(labels, np.float32)}
        for _ in range(layers)
    ]  # fmt: skip


def softmax(logits: np.ndarray) -> np.ndarray:
    """Return row-wise softmax probabilities (float64)."""
    z = np.asarray(logits, np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def build_students(weights: Sequence[dict], pooling: str, trainable: bool = False) -> list:
    """Return export's ``Student`` modules (float32) for student weights, exit 0 first."""
    import tensorflow as tf

    from export.model import Student

    return [Student(w, tf.float32, f"exit_{k}", pooling=pooling, trainable=trainable)
            for k, w in enumerate(weights)]  # fmt: skip


def student_logits(students: Sequence[Any], pooled: np.ndarray) -> np.ndarray:
    """Return each student's logits ``[L-1, n, N]`` for cached ``pooled`` ``[L-1, n, H]``."""
    return np.stack([s(x).numpy() for s, x in zip(students, pooled, strict=True)])


def agreement(logits: np.ndarray, teacher: np.ndarray) -> list[float]:
    """Return, per student, the fraction of rows whose argmax is the teacher's."""
    return [float(np.mean(lg.argmax(-1) == teacher.argmax(-1))) for lg in logits]


def layer_figures(logits: np.ndarray, teacher: np.ndarray, truth: np.ndarray | None) -> dict:
    """Return agreement with the teacher, accuracy (labels given), mean normalized entropy, KL."""
    import tensorflow as tf

    from export.model import normalized_entropy

    p_teacher = softmax(teacher)
    p = softmax(logits)
    kl = np.sum(p_teacher * (np.log(p_teacher + 1e-12) - np.log(p + 1e-12)), axis=-1)
    predicted = logits.argmax(-1)
    return {
        "agreement": float(np.mean(predicted == teacher.argmax(-1))),
        "accuracy": None if truth is None else float(np.mean(predicted == truth)),
        "mean_entropy": float(np.mean(normalized_entropy(tf.constant(logits)).numpy())),
        "kl": float(np.mean(kl)),
    }


def calibrate(logits: np.ndarray, teacher: np.ndarray, truth: np.ndarray | None
              ) -> list[dict[str, Any]]:  # fmt: skip
    """Return the speed calibration (finetune/calibration.py) from the students' dev ``logits``
    ``[L-1, n, N]`` and the teacher's ``[n, N]``: one row per knot speed."""
    import tensorflow as tf

    from export.model import normalized_entropy

    # the graph's own entropy function, so the dev figures are what the served rule computes
    entropies = normalized_entropy(tf.constant(logits)).numpy()
    return calibration_table(entropies, logits.argmax(-1), teacher.argmax(-1), truth)


def train_students(
    train: Features, dev: Features, pooling: str, config: DistillConfig, say: Say
) -> tuple[list[dict], list[dict]]:
    """Train one student per exit on cached vectors; return their weights and per-epoch history.

    The loss is the sum over students of the batch-mean KL(teacher ‖ student).
    """
    import keras
    import tensorflow as tf

    x_train, x_dev = train.pooled[pooling], dev.pooled[pooling]
    layers, n, hidden = x_train.shape
    labels = train.teacher.shape[1]
    init = initial_students(layers, hidden, config.width, labels, config.seed)
    students = build_students(init, pooling, trainable=True)
    variables = [v for s in students for v in s.named_variables().values()]
    optimizer = keras.optimizers.AdamW(learning_rate=config.learning_rate,
                                       weight_decay=config.weight_decay)  # fmt: skip
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    optimizer.build(variables)

    def step(x: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            kls = [tf.reduce_mean(tf.reduce_sum(
                       tf.math.xlogy(target, target) - target * tf.nn.log_softmax(s(x[k])), -1))
                   for k, s in enumerate(students)]  # fmt: skip
            loss = tf.add_n(kls)
        optimizer.apply(tape.gradient(loss, variables), variables)
        return tf.stack(kls)

    specs = [tf.TensorSpec([layers, None, hidden], tf.float32), tf.TensorSpec([None, labels])]
    train_step = tf.function(step, input_signature=specs, autograph=False)
    targets = softmax(train.teacher).astype(np.float32)
    history = []
    for epoch in range(config.epochs):
        order = np.random.default_rng(config.seed + epoch).permutation(n)
        total, batches = np.zeros(layers), 0
        for start in range(0, n, config.batch_size):
            chunk = order[start : start + config.batch_size]
            total += train_step(x_train[:, chunk], targets[chunk]).numpy()
            batches += 1
        agreed = agreement(student_logits(students, x_dev), dev.teacher)
        kl = float(np.sum(total) / max(batches, 1))
        history.append({"epoch": epoch + 1, "kl": kl, "dev_agreement": agreed})
        say(f"{pooling} epoch {epoch + 1}/{config.epochs}: KL {kl:.4f} (sum over "
            f"{layers} students), dev agreement by layer "
            f"{' '.join(f'{a:.3f}' for a in agreed)}")  # fmt: skip
    return [_weights(s) for s in students], history


def _weights(student: Any) -> dict[str, np.ndarray]:
    return {n: v.numpy().astype(np.float32) for n, v in student.named_variables().items()}


def _max_seq_len(config: DistillConfig, ckpt: Checkpoint, hf_config: dict[str, Any]) -> int:
    length = config.max_seq_len or int(hf_config.get("finetune_max_seq_len", 128))
    return min(length, ckpt.config.max_position)


def distill_exits(
    checkpoint: str | Path,
    texts_path: str | Path,
    dev_path: str | Path,
    out: str | Path,
    *,
    config: DistillConfig | None = None,
    say: Say | None = None,
) -> DistillResult:
    """Distil early-exit students from ``checkpoint``'s head and publish ``out``; return the report.

    Every refusal (existing ``out``, no trained head, < 2 labels, 1 layer, empty texts, bad rows)
    is a ``FinetuneError`` raised before anything is written.
    """
    started = time.perf_counter()
    say = say or (lambda _message: None)
    config = config or DistillConfig()
    checkpoint, out = Path(checkpoint), Path(out)
    _check_settings(config)
    if out.exists():
        raise FinetuneError(f"{out} exists; choose another --out")
    ckpt = read_checkpoint(checkpoint)
    _check_teacher(ckpt, checkpoint)
    texts = read_texts(texts_path)
    if not texts.texts:
        raise FinetuneError(f"{texts.path}: no texts to distil on")
    dev = _read_dev(Path(dev_path), ckpt.labels)
    hf_config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    max_seq_len = _max_seq_len(config, ckpt, hf_config)
    layers = list(range(1, ckpt.config.num_layers))
    say(f"{len(texts)} texts, {len(dev)} dev texts, {len(ckpt.labels)} labels, "
        f"students after layers {layers}, max_seq_len {max_seq_len}")  # fmt: skip
    candidates = POOLINGS if config.pooling == "auto" else (config.pooling,)
    train_features = encode(ckpt, texts.texts, max_seq_len, candidates)
    dev_features = encode(ckpt, dev.texts, max_seq_len, candidates)
    encode_s = time.perf_counter() - started
    say(f"encoded {len(texts) + len(dev)} texts once ({encode_s:.1f}s)")
    truth = None if dev.labels is None else np.array([ckpt.labels.index(y) for y in dev.labels])
    trained, mean_agreement = {}, {}
    for pooling in candidates:
        trained[pooling] = train_students(train_features, dev_features, pooling, config, say)
        mean_agreement[pooling] = float(np.mean(trained[pooling][1][-1]["dev_agreement"]))
    chosen = max(candidates, key=mean_agreement.__getitem__)  # ties: the first
    if len(candidates) > 1:
        figures = ", ".join(f"{p} {mean_agreement[p]:.3f}" for p in candidates)
        say(f"pooling auto: mean dev agreement {figures} → {chosen}")
    poolings = {p: {"agreement": dict(zip(map(str, layers), trained[p][1][-1]["dev_agreement"],
                                          strict=True)),
                    "mean_agreement": mean_agreement[p]} for p in candidates}  # fmt: skip
    students, history = trained[chosen]
    logits = student_logits(build_students(students, chosen), dev_features.pooled[chosen])
    per_layer = [{"layer": k, **layer_figures(lg, dev_features.teacher, truth)}
                 for k, lg in zip(layers, logits, strict=True)]  # fmt: skip
    teacher = layer_figures(dev_features.teacher, dev_features.teacher, truth)
    per_layer.append({"layer": ckpt.config.num_layers, "teacher": True, **teacher})
    calibration = calibrate(logits, dev_features.teacher, truth)
    say(f"speed calibration on {len(dev)} dev texts (speed = share of layers 1..{layers[-1]} "
        f"skipped; exits.json has every knot):\n{shown(calibration)}")  # fmt: skip
    report = {
        "pooling": chosen, "width": config.width, "layers": layers,
        "num_layers": ckpt.config.num_layers, "labels": list(ckpt.labels),
        "texts": len(texts), "texts_path": str(texts.path),
        "dev": {"path": str(dev.path), "texts": len(dev), "labelled": truth is not None},
        "per_layer": per_layer, "calibration": calibration, "poolings": poolings,
        "history": history,
        "settings": {**asdict(config), "max_seq_len": max_seq_len},
        "encode_s": encode_s, "source": ckpt.source,
    }  # fmt: skip
    with publishing(out) as temp:
        report["wall_s"] = time.perf_counter() - started
        _write(temp, checkpoint, ckpt, hf_config, students, report)
    return DistillResult(out=out, report=report)


def early_exits_entry(report: dict[str, Any]) -> dict[str, Any]:
    """Return config.json's ``early_exits`` entry (the contract's fields and a few more)."""
    students = [row for row in report["per_layer"] if not row.get("teacher")]
    return {
        "pooling": report["pooling"], "width": report["width"], "layers": report["layers"],
        "agreement": {str(row["layer"]): row["agreement"] for row in students},
        "texts": report["texts"], "epochs": report["settings"]["epochs"],
        "kl": report["history"][-1]["kl"],
        "calibration": config_entry(report["calibration"], report["dev"]["texts"]),
    }  # fmt: skip


def _write(dest: Path, source: Path, ckpt: Checkpoint, hf_config: dict[str, Any],
           students: Sequence[dict], report: dict[str, Any]) -> None:  # fmt: skip
    """Write the input checkpoint's files, its weights with the students, config and report
    (``hf_config``: the input's config.json, read once)."""
    from safetensors.numpy import save_file

    rewritten = ("model.safetensors", "config.json", EXITS_JSON)
    for item in source.iterdir():
        if item.name in rewritten:
            continue
        if item.is_dir():
            shutil.copytree(item, dest / item.name)
        else:
            shutil.copy2(item, dest / item.name)
    weights = {name: value for name, value in ckpt.weights.items() if not name.startswith("exit_")}
    for k, student in enumerate(students):
        weights.update({f"exit_{k}/{name}": value for name, value in student.items()})
    save_file(hf_tensors(ckpt.config, weights), str(dest / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    config = {**hf_config, "early_exits": early_exits_entry(report)}
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (dest / EXITS_JSON).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

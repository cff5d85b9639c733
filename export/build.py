"""``build``: a checkpoint in, a complete published SavedModel version out.

The version honours contract 1 of docs/architecture.md.

Steps: resolve the precision (``auto`` from the machine's capabilities, see export/precision.py),
read and check the checkpoint, build the FP32 reference model (and the converted one for
fp16/bf16), embed zero-shot label prompts, save under a temporary directory, reload what was saved
and measure it against the FP32 reference on a probe batch (refusing to publish beyond tolerance),
write assets and warmup records, fsync, rename. Any failure removes the temporary directory.

The gate (export/gates.py; export/README.md for what each head's rule measures and why):
embeddings need a minimum cosine to FP32; single-label classifiers keep every *decisive* argmax
and a bounded score drift; sigmoid heads keep every decisive per-label decision; regression heads
a bounded score error; tag heads the same BIO entities. An early-exit fp16/bf16 export is also
gated at its default speed (0.8 when 0) and at 1: the same exit layers, and the softmax rule on
the rows that leave at the same layer.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from export import __version__, gates
from export.calibration import model_json_entry, thresholds_of
from export.checkpoint import Checkpoint, read_checkpoint
from export.errors import ExportError
from export.gates import Tolerance, gate_metric, measure, within, worse
from export.hardware import CpuInfo, cpu_info
from export.heads import resolve_head
from export.precision import CHOICES, PrecisionChoice, choose_precision, verified_on, visible_gpus
from export.retrieval import RetrievalLayout, parse_kinds, read_retrieval, retrieval_head
from export.sentence_modules import SentenceModules, read_sentence_modules
from export.splade import (
    choose_top_k,
    model_json_entries,
    splade_checkpoint,
    splade_spec,
    write_idf_asset,
)
from modelformat.heads import SINGLE, Head
from modelformat.layout import LABELS_TXT, MODEL_JSON, VOCAB_TXT
from modelformat.publish import (
    choose_version,
    fsync_tree,
    model_dir_for,
    publish,
    temp_version,
    tree_size,
)

TASKS = ("classify", "embed", "tag")
POOLINGS = ("mean", "cls")
ZERO_SHOT_SCALE = 20.0  # sentence-transformers' cosine scale; sharp enough for MiniLM intents
PROBE_BATCH = 8

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildResult:
    """A published version: where, which number, how big, and the measured conversion error."""

    path: Path
    version: int
    size_bytes: int
    conversion: dict[str, Any]
    model_info: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    warnings: tuple[str, ...] = ()

    def _precision(self) -> str:
        """Return the precision, with auto's reason when auto chose it."""
        precision = str(self.model_info.get("precision", "?"))
        if self.model_info.get("precision_requested") == "auto":
            return f"{precision}: auto, {self.model_info.get('precision_reason')}"
        return precision

    def summary(self) -> str:
        """Return the one-line summary the CLI prints last."""

        def show(figures: dict[str, Any], skip: tuple[str, ...]) -> str:
            return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in figures.items() if k not in skip)  # fmt: skip

        figures = show(self.conversion, ("reference", "probe_shape", "metric", "early_exit"))
        exits = "".join(f"; at speed {e['speed']:g}: {show(e, ('speed',))}"
                        for e in self.conversion.get("early_exit", ()))  # fmt: skip
        return (
            f"published {self.path} ({self.size_bytes / 1e6:.1f} MB, "
            f"{self._precision()}) in {self.wall_s:.1f}s; "
            f"vs fp32: {figures}{exits}"
        )


DEFAULT_MAX_SEQ_LEN = 128


def choose_max_seq_len(asked: int | None, ckpt: Checkpoint) -> tuple[int, str]:
    """Return the max_seq_len to export with and where it comes from: the one asked (--max-seq-len),
    else the default, cut to the tokenizer's model_max_length where that is lower (a model whose
    tokenizer reads at most 64 tokens is served at 64, as transformers' pipelines cut it)."""
    if asked is not None:
        return asked, "--max-seq-len"
    stated = ckpt.tokenizer.model_max_length if ckpt.tokenizer is not None else None
    if stated is not None and stated < DEFAULT_MAX_SEQ_LEN:
        return stated, "the tokenizer's model_max_length (tokenizer_config.json)"
    return DEFAULT_MAX_SEQ_LEN, f"the default {DEFAULT_MAX_SEQ_LEN}"


def _check_args(task: str, precision: str, pooling: str | None, max_seq_len: int | None) -> None:
    for value, allowed, what in (
        (task, TASKS, "task"),
        (precision, CHOICES, "precision"),
        (pooling or POOLINGS[0], POOLINGS, "pooling"),
    ):
        if value not in allowed:
            raise ExportError(f"{what} must be one of {list(allowed)}, got {value!r}")
    if max_seq_len is not None:  # the flag: refused before the checkpoint is read
        check_max_seq_len(max_seq_len, "--max-seq-len", None)


def check_max_seq_len(length: int, source: str, max_position: int | None) -> None:
    """Return None if ``length`` (from ``source``) can be served: a [CLS] and a [SEP] at least,
    and no more tokens than the checkpoint has position embeddings (``max_position``, None: not
    known yet); raise ExportError naming the rule and where the length came from otherwise."""
    if length < 2:
        raise ExportError(f"max_seq_len must be at least 2, got {length} ({source})")
    if max_position is not None and length > max_position:
        raise ExportError(
            f"max_seq_len {length} ({source}) exceeds the checkpoint's max_position_embeddings "
            f"{max_position}"
        )


def build(
    checkpoint: str | Path,
    name: str,
    base_path: str | Path,
    *,
    version: int | None = None,
    task: str = "classify",
    precision: str = "fp32",
    max_seq_len: int | None = None,
    labels: Sequence[str] | None = None,
    label_prompts: str | Path | None = None,
    pooling: str | None = None,
    warmup: bool = True,
    tolerance: Tolerance | None = None,
    progress: Progress | None = None,
    do_lower_case: bool | None = None,
    cpu: CpuInfo | None = None,
    gpus: Sequence[str] | None = None,
    early_exit: bool = False,
    default_speed: float = 0.0,
    problem_type: str | None = None,
    text_pair: bool | None = None,
    top_k: int | None = None,
    outputs: str | Sequence[str] | None = None,
) -> BuildResult:
    """Export ``checkpoint`` as ``<base_path>/<name>/<version>`` and return what was published.

    ``precision`` is ``auto`` or one of fp32/fp16/bf16; ``cpu`` and ``gpus`` default to this
    machine's (tests inject other machines'). ``early_exit`` serves the checkpoint's distilled
    students (a ``speed`` input, an ``exit_layer`` output); ``default_speed`` goes into model.json
    for the gateway. ``pooling`` (mean or cls; default mean) is for checkpoints that don't say:
    a sentence-transformers checkpoint's modules.json (its Pooling, Dense, Normalize, prompts:
    export/sentence_modules.py) decides an embedding export. ``task`` ``tag`` exports a token
    classifier (``BertForTokenClassification``, BIO labels); a classifier's ``problem_type``,
    ``thresholds`` and ``text_pair`` come from the
    checkpoint's config.json unless ``problem_type`` / ``text_pair`` are given here.
    ``max_seq_len`` None: ``DEFAULT_MAX_SEQ_LEN``, or the tokenizer's ``model_max_length`` where
    that is lower (model.json's ``max_seq_len_source`` says which). A SPLADE checkpoint
    (sentence-transformers ``SparseEncoder``, inference-free ``Router`` too: export/splade.py),
    exported with task ``embed``, answers the ``top_k`` (default 256, at most the vocabulary)
    largest pooled weights per text.
    that is lower (model.json's ``max_seq_len_source`` says which).
    ``outputs`` (``--outputs``: some of dense, sparse, multivector) narrows an embedding export of
    a retrieval layout (BGE-M3's heads, a ColBERT: export/retrieval.py, found from the
    checkpoint's files) to those kinds, and refuses a checkpoint that lacks one.
    """
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    tolerance = tolerance or Tolerance()
    _check_args(task, precision, pooling, max_seq_len)
    cpu = cpu or cpu_info()
    gpus = visible_gpus() if gpus is None else list(gpus)
    choice = choose_precision(precision, cpu, gpus)
    say(f"precision {choice.precision} ({choice.reason})")
    for warning in choice.warnings:
        say(f"warning: {warning}")
    precision = choice.precision
    if label_prompts is not None and task != "classify":  # also refuses tag
        raise ExportError("--label-prompts builds a classification head: use it with task classify")
    if label_prompts is not None and labels is not None:
        raise ExportError("give either labels or label prompts, not both")
    if early_exit and (task != "classify" or label_prompts is not None):
        raise ExportError(
            "--early-exit needs a single-label classifier trained with students (finetune "
            f"distill-exits): not an embedding or zero-shot export, nor a tag model (task {task})"
        )
    if not 0.0 <= default_speed <= 1.0:  # also refuses NaN
        raise ExportError(f"default speed must be in [0, 1], got {default_speed}")
    model_dir = model_dir_for(base_path, name)
    version = choose_version(model_dir, version)

    say(f"reading weights from {checkpoint}")
    splade = splade_checkpoint(checkpoint, task, top_k)
    source = checkpoint if splade is None else splade.model_dir  # a Router's: document side's
    ckpt = read_checkpoint(source, labels=labels, do_lower_case=do_lower_case)
    max_seq_len, length_source = choose_max_seq_len(max_seq_len, ckpt)
    # the chosen length, the flag's or the tokenizer's, held to the same rules
    check_max_seq_len(max_seq_len, length_source, ckpt.config.max_position)
    say(f"max_seq_len {max_seq_len} ({length_source})")
    if task == "tag" and not ckpt.has_head:
        raise ExportError(
            f"{checkpoint}: no token classifier (classifier.weight); a tag model is a "
            "BertForTokenClassification checkpoint"
        )
    head = resolve_head(task, ckpt.head_config, ckpt.labels, problem_type=problem_type,
                        text_pair=text_pair, zero_shot=label_prompts is not None)  # fmt: skip
    if early_exit and (head.problem_type != SINGLE or head.activation != "softmax"):
        raise ExportError(
            f"--early-exit serves single-label classifiers only, not {head.describe()} "
            f"(problem_type {head.problem_type}, {len(ckpt.labels)} labels)"
        )
    if task == "classify" and label_prompts is None:
        if not ckpt.has_head:
            raise ExportError(
                f"{checkpoint}: no classifier head (classifier.weight / output_weights); "
                "use --task embed, or --label-prompts for a zero-shot head"
            )
        if "pooler/kernel" not in ckpt.weights:
            raise ExportError(f"{checkpoint}: classifier head present but no pooler dense weights")
    if early_exit and ckpt.exits is None:
        raise ExportError(
            f"{checkpoint}: no trained early-exit students; make them with "
            "`python -m finetune distill-exits --checkpoint ...` and export that checkpoint"
        )
    exits = ckpt.exits if early_exit else None
    sentence = None
    spec = None
    retrieval = None
    if splade is not None:
        if pooling is not None:
            raise ExportError(
                f"{checkpoint}: a SPLADE model pools as its SpladePooling says "
                f"({splade.pooling}), not --pooling {pooling}: drop --pooling"
            )
        top_k = choose_top_k(top_k, ckpt.config.vocab_size)
        say(f"SPLADE: {splade.pooling} pooling of {splade.activation}, top {top_k} of "
            f"{ckpt.config.vocab_size}"
            + (f"; queries from the IDF table {splade.query_source}" if splade.inference_free
               else ""))  # fmt: skip
        spec = splade_spec(splade, ckpt.config, ckpt.weights["embeddings/word"], top_k)
        pooling = f"splade_{splade.pooling}"
    else:
        retrieval = _retrieval(checkpoint, ckpt, task, outputs, max_seq_len, pooling, say)
        sentence = None if retrieval else _sentence_modules(checkpoint, ckpt, task, pooling)
    if sentence is not None:
        say(f"sentence-transformers modules: {'+'.join(sentence.poolings)} pooling, "
            f"{len(sentence.dense)} dense, normalize {sentence.normalize}, "
            f"prompts {sorted(sentence.prompts) or 'none'}")  # fmt: skip
        pooling = "+".join(sentence.poolings)
    pooling = pooling or POOLINGS[0]
    if retrieval is not None:
        pooling = "cls" if retrieval.outputs.dense is not None else "none"

    say(
        f"building {task} model ({ckpt.config.num_layers} layers, hidden {ckpt.config.hidden_size})"
    )
    reference, target, out_labels, scale = _build_modules(
        ckpt,
        task,
        precision,
        pooling,
        max_seq_len,
        label_prompts,
        say,
        exits,
        head.activation,
        sentence,
        spec,
        retrieval,
    )
    probe = _probe_batch(ckpt, max_seq_len, exits is not None)
    expected = _run(reference.serve, probe)
    # fp32 saves the reference itself; a converted graph's students and exits are gated too
    converted = exits is not None and precision != "fp32"
    speeds = gates.exit_gate_speeds(default_speed) if converted else ()
    at_speeds = gates.exit_probes(lambda feeds: _run(reference.serve, feeds), probe, speeds,
                                  thresholds_of(exits))  # fmt: skip

    try:
        with temp_version(model_dir, version) as temp:
            path = _write_version(
                temp, model_dir, version, name=name, ckpt=ckpt, target=target, task=task,
                precision=precision, max_seq_len=max_seq_len, length_source=length_source,
                pooling=_served_pooling(task, pooling, label_prompts is not None,
                                        ckpt.config.classifier_pooling), head=head,
                labels=out_labels, zero_shot_scale=scale, probe=probe, expected=expected,
                tolerance=tolerance, warmup=warmup, say=say, choice=choice,
                verified=verified_on(cpu, gpus),
                early_exit=_early_exit_info(exits, ckpt, default_speed), exit_probes=at_speeds,
                sentence=sentence, retrieval=retrieval,
                splade=None if splade is None else (splade, spec),
            )  # fmt: skip
    except OSError as exc:  # disk full, read-only, permissions: the temp dir is already gone
        where = exc.filename or model_dir
        raise ExportError(f"writing {where} failed: {exc.strerror or exc}") from exc
    except Exception as exc:
        import tensorflow as tf

        if isinstance(exc, tf.errors.OpError):  # TF's file writers report ENOSPC/EACCES this way
            raise ExportError(f"writing under {model_dir} failed: {exc.message}") from exc
        raise
    info = json.loads((path / MODEL_JSON).read_text(encoding="utf-8"))
    return BuildResult(
        path=path,
        version=version,
        size_bytes=tree_size(path),
        conversion=info["conversion"],
        model_info=info,
        wall_s=time.perf_counter() - started,
        warnings=choice.warnings,
    )


def _build_modules(
    ckpt: Checkpoint,
    task: str,
    precision: str,
    pooling: str,
    max_seq_len: int,
    label_prompts: str | Path | None,
    say: Progress,
    exits: dict[str, Any] | None = None,
    activation: str = "softmax",
    sentence: SentenceModules | None = None,
    splade: Any = None,
    retrieval: RetrievalLayout | None = None,
) -> tuple[Any, Any, list[str], float | None]:
    """Return (FP32 reference module, module to save, labels, zero-shot scale or None)."""
    from export.model import EncoderModule, run

    label_vectors = None
    labels = ckpt.labels if task in ("classify", "tag") else []
    scale = None
    if label_prompts is not None:
        from export.zeroshot import label_embeddings, read_label_prompts

        pairs = read_label_prompts(label_prompts)
        say(f"embedding {len(pairs)} label prompts for a zero-shot head")
        encoder = EncoderModule(ckpt.config, ckpt.weights, task="embed", pooling=pooling)
        labels, label_vectors = label_embeddings(
            pairs,
            lambda feeds: run(encoder.encode, feeds)["output"],
            ckpt.vocab,
            ckpt.do_lower_case,
            max_seq_len,
            ckpt.tokenizer.json_text if ckpt.tokenizer is not None else None,
            int(ckpt.tokenizer.entry.get("pad_id", 0)) if ckpt.tokenizer is not None else 0,
        )
        scale = ZERO_SHOT_SCALE

    def make(prec: str) -> Any:
        head = None
        if sentence is not None:
            from export.sentence_head import SentenceHead

            head = SentenceHead(sentence)
        return EncoderModule(
            ckpt.config, ckpt.weights, task=task, precision=prec, pooling=pooling,
            label_embeddings=label_vectors, zero_shot_scale=scale or ZERO_SHOT_SCALE,
            early_exit=exits, activation=activation, sentence_head=head, splade=splade,
            # a retrieval layout's heads are float32 at every precision (as SentenceHead's)
            retrieval=None if retrieval is None else retrieval_head(retrieval),
        )  # fmt: skip

    reference = make("fp32")
    if precision == "fp32":
        return reference, reference, labels, scale
    say(f"converting weights to {precision} (matmuls in {precision}; norms, softmax in fp32)")
    return reference, make(precision), labels, scale


def _retrieval(
    checkpoint: str | Path, ckpt: Checkpoint, task: str, outputs: str | Sequence[str] | None,
    max_seq_len: int, pooling: str | None, say: Progress,
) -> RetrievalLayout | None:  # fmt: skip
    """Return the checkpoint's retrieval layout (None: not one); ExportError for a broken one,
    --outputs it lacks, or --pooling beside it."""
    found = read_retrieval(checkpoint, ckpt, task, parse_kinds(outputs), max_seq_len)
    if found is None:
        return None
    if pooling is not None and (found.outputs.dense is None or pooling != "cls"):
        raise ExportError(
            f"{checkpoint}: the {found.layout} layout decides its vectors (dense: CLS, or "
            f"none), not --pooling {pooling}: drop --pooling"
        )
    say(found.describe())
    return found


def _sentence_modules(
    checkpoint: str | Path, ckpt: Checkpoint, task: str, pooling: str | None
) -> SentenceModules | None:
    """Return an embedding export's sentence-transformers modules (None: not such a
    checkpoint, or another task); ExportError when --pooling contradicts its Pooling."""
    path = Path(checkpoint)
    if task != "embed" or not path.is_dir():
        return None
    sentence = read_sentence_modules(path, ckpt.config.hidden_size)
    if sentence is None:
        return None
    if pooling is not None and [pooling] != sentence.poolings:
        raise ExportError(
            f"{path / 'modules.json'}: the checkpoint pools with {'+'.join(sentence.poolings)} "
            f"(its Pooling module), not {pooling}: drop --pooling"
        )
    bert_config = path / "sentence_bert_config.json"
    if bert_config.is_file():
        try:
            lower = json.loads(bert_config.read_text(encoding="utf-8")).get("do_lower_case")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
            raise ExportError(f"cannot read {bert_config}: {exc}") from exc
        if lower:
            raise ExportError(
                f"{bert_config}: do_lower_case true (sentence-transformers lower-cases the text "
                "before its tokenizer) is not served"
            )
    return sentence


@contextlib.contextmanager
def _functions_untracked(module: Any) -> Iterator[None]:
    """Return a context in which ``module``'s own ``tf.function`` attributes (``serve``,
    ``encode``) are detached, so that a SavedModel written meanwhile holds its signatures and
    variables only.

    Saved as attributes they are traced again and written beside the signatures (``serve``
    as a second copy of serving_default's graph), and every load rebuilds them in Python: half
    of a tiny version's ``tf.saved_model.load`` CPU (0.41 -> 0.20 s), 37% of an early-exit one
    (1.00 -> 0.63 s), paid at each model server start. Nothing calls them on a loaded model:
    TF Serving and ``PersistentPredictor`` call signatures.
    """
    import tensorflow as tf

    generic = tf.types.experimental.GenericFunction
    detached = {n: v for n, v in vars(module).items() if isinstance(v, generic)}
    for name in detached:
        delattr(module, name)
    try:
        yield
    finally:
        for name, function in detached.items():
            setattr(module, name, function)


def _served_pooling(task: str, pooling: str, zero_shot: bool, head_pooling: str = "cls") -> str:
    """Return model.json's ``pooling``: what the served head reads of the hidden states."""
    if task == "tag":
        return "none"  # every token's own vector
    # a trained classifier reads what its architecture's head pools ([CLS]; ModernBERT's may
    # mean-pool) whatever --pooling says
    return head_pooling if task == "classify" and not zero_shot else pooling


def special_ids(vocab: Sequence[str]) -> tuple[int, int]:
    """Return the ids of ``[CLS]`` and ``[SEP]`` (0 when a vocabulary lacks them)."""
    index = {token: i for i, token in enumerate(vocab[:1000])}  # specials sit near the start
    return index.get("[CLS]", 0), index.get("[SEP]", 0)


def _special_ids(ckpt: Checkpoint) -> tuple[int, int]:
    """Return the first and last special token of one text ([CLS] / <s>, [SEP] / </s>)."""
    if ckpt.tokenizer is not None:
        return ckpt.tokenizer.special_ids()
    return special_ids(ckpt.vocab)


def _early_exit_info(
    exits: dict[str, Any] | None, ckpt: Checkpoint, default_speed: float
) -> dict[str, Any] | None:
    """Return model.json's ``early_exit`` entry (None for a model without exits)."""
    if exits is None:
        return None
    layers = ckpt.config.num_layers
    return {
        "default_speed": default_speed,
        "num_layers": layers,
        "layers": list(range(1, layers)),
        "pooling": exits["pooling"],
        "width": int(ckpt.weights["exit_0/dense/kernel"].shape[1]),
        "agreement": exits.get("agreement", {}),
        # what a speed means: the distill-time table (expected exit layer, agreement, accuracy
        # per speed) or the raw entropy threshold of a checkpoint distilled before calibration
        "speed_calibration": model_json_entry(exits),
    }


def _probe_batch(ckpt: Checkpoint, max_seq_len: int, speed: bool = False) -> dict[str, np.ndarray]:
    from export.warmup import token_batch

    cls_id, sep_id = _special_ids(ckpt)
    # speed 0 for an early-exit graph: it must give the full model's outputs
    return token_batch(PROBE_BATCH, min(64, max_seq_len), len(ckpt.vocab), cls_id, sep_id, 1234,
                       speed=0.0 if speed else None)  # fmt: skip


def _run(fn: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from export.model import run

    return run(fn, feeds)


def _write_version(
    temp: Path,
    model_dir: Path,
    version: int,
    *,
    name: str,
    ckpt: Checkpoint,
    target: Any,
    task: str,
    precision: str,
    pooling: str,
    max_seq_len: int,
    labels: list[str],
    length_source: str = "--max-seq-len",
    zero_shot_scale: float | None,
    probe: dict[str, np.ndarray],
    expected: dict[str, np.ndarray],
    tolerance: Tolerance,
    warmup: bool,
    say: Progress,
    choice: PrecisionChoice,
    verified: dict[str, Any],
    early_exit: dict[str, Any] | None = None,
    head: Head | None = None,
    exit_probes: Sequence[gates.ExitProbe] = (),
    sentence: SentenceModules | None = None,
    splade: tuple[Any, Any] | None = None,
    retrieval: RetrievalLayout | None = None,
) -> Path:
    """Fill ``temp`` with the SavedModel, assets and warmup; publish it; return the version dir."""
    import tensorflow as tf

    from export.heads import output_names
    from export.model import INPUT_NAMES, SPEED
    from export.warmup import token_batch, warmup_plan, write_warmup
    from modelformat.buckets import buckets, signature_name
    from modelformat.outputs import kind_signatures

    lens = buckets(max_seq_len)
    bucket_signatures = {str(n): signature_name(n) for n in lens}
    # more than one kind: each signature also narrowed to each subset of them (REST's filter)
    subsets = kind_signatures(retrieval.outputs) if retrieval is not None else {}
    narrowed = f", each also narrowed to {', '.join(subsets)}" if subsets else ""
    say(f"writing SavedModel to {temp} (serving_default + "
        f"{', '.join(bucket_signatures.values())}{narrowed})")  # fmt: skip
    signatures = target.signatures(lens, subsets)
    with _functions_untracked(target):
        tf.saved_model.save(target, str(temp), signatures=signatures)
    say("verifying the saved model against fp32 on a probe batch")
    loaded = tf.saved_model.load(str(temp))

    def gauge(signature: str) -> dict[str, Any]:
        got = _run(loaded.signatures[signature], probe)
        return measure(expected, got, zero_shot_scale, head=head, labels=labels,
                       attention_mask=probe["attention_mask"])  # fmt: skip

    figures = gauge("serving_default")
    # The probe's length is always a bucket (min(64, max_seq_len)): check that signature too.
    probe_sig = bucket_signatures.get(str(probe["input_ids"].shape[1]))
    checked = ["serving_default", *([probe_sig] if probe_sig else [])]
    exit_figures = [gates.measure_exits(p, [_run(loaded.signatures[s], p.feeds) for s in checked],
                                        len(target.layers)) for p in exit_probes]  # fmt: skip
    if probe_sig is not None:
        bucket_figures = gauge(probe_sig)
        figures = {k: worse(k, v, bucket_figures[k]) for k, v in figures.items()}
    figures = {
        **figures,
        "metric": gate_metric(figures),
        "reference": "fp32",
        "probe_shape": list(probe["input_ids"].shape),
        **({"early_exit": exit_figures} if exit_figures else {}),
    }
    say("conversion: " + ", ".join(f"{k}={v}" for k, v in figures.items()))
    if not within(figures, tolerance):
        raise ExportError(
            f"{precision} conversion error beyond tolerance ({tolerance}): {figures}; not published"
        )
    for at in exit_figures:
        if bad := gates.exit_violations(at, tolerance):
            raise ExportError(f"{precision} early-exit conversion beyond tolerance at speed "
                              f"{at['speed']:g} ({', '.join(bad)}; {tolerance}): {at}; "
                              "not published")  # fmt: skip
        if at["early_rows"] == 0:
            say(f"warning: no probe row leaves before the last layer at speed {at['speed']:g}")
    info = {
        "name": name,
        "task": task,
        "max_seq_len": max_seq_len,
        "max_seq_len_source": length_source,  # the flag, the tokenizer's, or the default
        "do_lower_case": ckpt.do_lower_case,
        "precision": precision,
        "precision_requested": choice.requested,
        "precision_reason": choice.reason,
        "verified_on": verified,
        "labels": labels,
        "pooling": pooling,
        "zero_shot": zero_shot_scale is not None,
        "inputs": [*INPUT_NAMES, SPEED] if early_exit else list(INPUT_NAMES),
        # the signature's output names; a retrieval layout's kinds (modelformat/outputs.py)
        "outputs": retrieval.outputs.to_info()
        if retrieval is not None
        else output_names(task, early_exit is not None),
        "bucket_signatures": bucket_signatures,
        "architecture": ckpt.config.model_type,  # config.json's model_type
        "hidden_size": ckpt.config.hidden_size,
        "vocab_size": ckpt.config.vocab_size,
        "num_layers": ckpt.config.num_layers,
        "source": ckpt.source,
        "exporter_version": __version__,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "conversion": figures,
    }
    # task, problem_type, score_activation, text_pair, thresholds, label_scheme (modelformat/heads)
    info.update((head or Head(task=task)).to_info())
    if zero_shot_scale is not None:
        info["zero_shot_scale"] = zero_shot_scale
    if early_exit is not None:
        info["early_exit"] = early_exit
    if splade is not None:  # outputs.sparse (top_k, pooling, the query side), pooling
        info.update(model_json_entries(splade[0], splade[1].top_k, ckpt.config.vocab_size))
        write_idf_asset(temp, splade[0], ckpt.config.vocab_size, _special_ids(ckpt))
    if retrieval is not None:
        info["retrieval_layout"] = retrieval.layout
        if subsets:
            info["kind_signatures"] = {k: list(v) for k, v in subsets.items()}
    if task == "embed" and "embedding" in expected:
        info["embedding_dim"] = int(expected["embedding"].shape[-1])
    if sentence is not None:  # prompts and normalize for the gateway
        info["sentence_transformers"] = sentence.model_json_entry()
    (temp / "assets").mkdir(exist_ok=True)
    if ckpt.tokenizer is not None:  # tokenizer.json (+ vocab.txt for a WordPiece one)
        ckpt.tokenizer.write(temp)
        info["tokenizer"] = ckpt.tokenizer.entry
    else:
        (temp / VOCAB_TXT).write_text("\n".join(ckpt.vocab) + "\n", encoding="utf-8")
    if task in ("classify", "tag"):
        (temp / LABELS_TXT).write_text("\n".join(labels) + "\n", encoding="utf-8")
    (temp / MODEL_JSON).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    if warmup:
        plan = warmup_plan(max_seq_len)
        per_signature = Counter(sig for sig, _, _ in plan)
        say(f"writing {len(plan)} warmup records ({dict(per_signature)}, batches 1/8/32)")
        cls_id, sep_id = _special_ids(ckpt)
        speed = None if early_exit is None else 0.0  # every layer at the full batch size warmed
        batches = [
            token_batch(b, n, len(ckpt.vocab), cls_id, sep_id, seed=i, speed=speed)
            for i, (_, b, n) in enumerate(plan)
        ]
        write_warmup(temp, name, batches, [sig for sig, _, _ in plan])
    say(f"publishing version {version}")
    fsync_tree(temp)
    return publish(temp, model_dir, version)

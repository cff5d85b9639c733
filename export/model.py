"""The encoder of the BERT family as a plain TF2 ``tf.Module`` (no Keras, no TF1 graph code).

One layer loop for every architecture: what differs (embeddings and position ids, attention
variant, feed-forward, norms, head) is export/architectures/'s table, read through
``config.model_type``. ``EncoderModule`` is the one model module of every architecture (named
``BertModule`` before the BERT family; finetune builds it too).

The building blocks are export/layers.py's, the heads' outputs export/heads.py's, and the early
exits (students, the exit rule, compacted and masked serving) export/exits.py's; this module
puts them together and writes the signatures.

Precision: in ``fp16``/``bf16`` the embedding tables, kernels and biases are stored in that dtype
and every matmul runs in it, while the residual stream, layer norm, softmax, GELU and all outputs
stay float32. Low-precision accumulation across layers is what loses accuracy; keeping the
residual stream float32 keeps the error at the level of one matmul's rounding.
The serving signature is always int32 in, float32 out (docs/architecture.md, contract 1).

Training (finetune/) uses this same module with ``trainable=True``: variables stay float32 and a
``compute_dtype`` (from a Keras mixed-precision policy) runs the matmuls in bf16/fp16, while
``logits(..., dropout_seed=...)`` adds BERT's dropout, stateless so a resumed run repeats its masks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from export.architectures import architecture
from export.calibration import thresholds_of
from export.config import BertConfig
from export.exits import Student, checked_speed, serve_compacted, serve_masked, speed_thresholds
from export.exits import exit_weight_names as exit_weight_names  # re-exported (finetune)
from export.exits import normalized_entropy as normalized_entropy  # re-exported (finetune)
from export.heads import head_outputs, token_logits
from export.layers import (
    Dense,
    Layer,
    LayerNorm,
    Step,
    activation,
    deberta_indices,
    dropout,
    mask_bias,
    mpnet_bias,
    pool,
    rotary,
    window_bias,
)
from modelformat.buckets import signature_name

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
SPEED = "speed"  # the early-exit graph's extra input: float32 [batch], one speed per row


class EncoderModule(tf.Module):
    """An encoder of any supported architecture with a ``classify`` (trained or zero-shot),
    ``tag`` or ``embed`` head.

    ``serve`` is the ``serving_default`` function; ``encode`` returns pooled float32 sentence
    vectors and is what the zero-shot head uses to embed label descriptions at export time.
    """

    def __init__(
        self,
        config: BertConfig,
        weights: Mapping[str, np.ndarray],
        *,
        task: str,
        precision: str = "fp32",
        pooling: str = "mean",
        label_embeddings: np.ndarray | None = None,
        zero_shot_scale: float = 20.0,
        trainable: bool = False,
        compute_dtype: tf.DType | None = None,
        early_exit: Mapping[str, Any] | None = None,
        compaction: bool = True,
        activation: str = "softmax",
        sentence_head: tf.Module | None = None,
        splade: Any = None,
        retrieval: tf.Module | None = None,
    ) -> None:
        """Build the module; ``trainable``/``compute_dtype`` are for training (see module doc).

        ``early_exit`` (a checkpoint's ``early_exits`` entry: ``pooling``, ``calibration``) serves
        the students in ``weights`` (``exit_{k}/...``): ``serve`` then takes a per-row ``speed``
        (mapped to an entropy threshold by the calibration, if any) and returns ``exit_layer``.
        ``compaction=False`` keeps exited rows in the batch until every row has exited (the
        baseline the benchmark compares against); the outputs are the same.
        ``activation`` turns a classifier's logits into ``probabilities`` (export/heads.py); a
        ``tag`` head is a classifier over every token (no pooler), its scores a softmax.
        ``sentence_head`` (export/sentence_head.py) replaces ``pooling`` with a
        sentence-transformers checkpoint's pooling -> dense -> normalize. ``splade``
        (export/splade.py's ``SpladeSpec``) makes an ``embed`` model answer SPLADE's top-k
        ``sparse_indices`` / ``sparse_values`` (export/splade_head.py) instead of a vector.
        ``retrieval`` (export/retrieval.py) makes an embedder answer BGE-M3's or ColBERT's
        outputs (``embedding``, ``token_weights``, ``token_vectors``) from one forward pass.
        """
        super().__init__(name="bert")
        dtype = DTYPES[precision]
        self.task, self.pooling, self.activation = task, pooling, activation
        self.compaction = compaction
        self.sentence_head = sentence_head
        self.retrieval = retrieval
        self.config = config
        self.architecture = architecture(config.model_type)
        self.hidden_size = config.hidden_size
        self.hidden_dropout = config.hidden_dropout

        def table(name: str) -> tf.Variable:
            return tf.Variable(tf.cast(weights[name], dtype), trainable=trainable,
                               name=name.replace("/", "_"))  # fmt: skip

        def dense(name: str) -> Dense:
            return Dense(weights[f"{name}/kernel"], weights.get(f"{name}/bias"), dtype,
                         name.replace("/", "_"), trainable=trainable,
                         compute_dtype=compute_dtype)  # fmt: skip

        def norm(name: str) -> LayerNorm:
            return LayerNorm(weights[f"{name}/gamma"], weights.get(f"{name}/beta"),
                             config.layer_norm_eps, dtype, name, trainable=trainable)  # fmt: skip

        self.word = table("embeddings/word")
        self.splade: Any = None
        if splade is not None:
            from export.splade_head import splade_head

            self.splade = splade_head(splade, dtype, self.word)
        self.position = table("embeddings/position") if "embeddings/position" in weights else None
        self.token_type = (
            table("embeddings/token_type") if "embeddings/token_type" in weights else None
        )
        self.embeddings_ln = norm("embeddings_ln")
        self.projection = (
            dense("embeddings/projection") if "embeddings/projection/kernel" in weights else None
        )
        self.relative = table("relative/embeddings") if "relative/embeddings" in weights else None
        self.relative_bias = table("relative/bias") if "relative/bias" in weights else None
        self.relative_ln = norm("relative_ln") if "relative_ln/gamma" in weights else None
        self.final_ln = norm("final_ln") if "final_ln/gamma" in weights else None
        unique = [
            Layer(_layer_weights(weights, k), config, dtype, f"layer_{k}", trainable=trainable,
                  compute_dtype=compute_dtype, architecture=self.architecture, index=k)
            for k in range(config.unique_layers)
        ]  # fmt: skip
        self.unique_layers = unique
        plan = config.plan
        # BERT's loop runs each layer once: the layer is the step (the graph as it always was)
        self.layers: list[Any] = [
            unique[step[0]]
            if len(step) == 1 and (self.final_ln is None or i < len(plan) - 1)
            else Step([unique[k] for k in step], self.final_ln if i == len(plan) - 1 else None,
                      f"step_{i}")
            for i, step in enumerate(plan)
        ]  # fmt: skip
        self.zero_shot = label_embeddings is not None
        head_dense = task == "classify" or (task == "tag" and self.architecture.tag_head_dense)
        if task == "classify" and self.zero_shot:
            assert label_embeddings is not None
            unit = label_embeddings / np.linalg.norm(label_embeddings, axis=1, keepdims=True)
            self.label_matrix = tf.Variable(unit.T.astype(np.float32), trainable=False)
            self.scale = tf.constant(zero_shot_scale, tf.float32)
        elif task in ("classify", "tag"):
            if head_dense:
                self.pooler = dense("pooler")
                self.head_ln = norm("head_ln") if "head_ln/gamma" in weights else None
            self.classifier = dense("classifier")
        self.students: list[Student] = []
        self.exit_pooling = ""
        # the calibration's knots (graph constants), None: the speed is the raw threshold
        self.exit_thresholds = thresholds_of(early_exit)
        if early_exit is not None:
            self.exit_pooling = str(early_exit.get("pooling", "mean"))
            self.students = [
                Student(_prefixed(weights, f"exit_{k}/"), dtype, f"exit_{k}",
                        pooling=self.exit_pooling, trainable=trainable,
                        compute_dtype=compute_dtype)
                for k in range(config.num_layers - 1)
            ]  # fmt: skip
        specs = [tf.TensorSpec([None, None], tf.int32, name=n) for n in INPUT_NAMES]
        self.serve = tf.function(
            self._serving_fn(), input_signature=self._specs(None), autograph=False
        )
        self.encode = tf.function(self._encode, input_signature=specs, autograph=False)

    @property
    def early_exit(self) -> bool:
        """Whether the served graph has early exits (``speed`` in, ``exit_layer`` out)."""
        return bool(self.students)

    def _specs(self, seq_len: int | None) -> list[tf.TensorSpec]:
        specs = [tf.TensorSpec([None, seq_len], tf.int32, name=n) for n in INPUT_NAMES]
        if self.early_exit:
            specs.append(tf.TensorSpec([None], tf.float32, name=SPEED))
        return specs

    def _serving_fn(self) -> Any:
        return self._serve_exits if self.early_exit else self._serve

    def positions(self, seq: tf.Tensor) -> dict[str, Any]:
        """Return what every layer's attention reads of the positions (export/layers.py)."""
        arch, config = self.architecture.attention, self.config
        if arch == "relative_bias":
            assert self.relative_bias is not None
            return {"relative_bias": mpnet_bias(self.relative_bias, seq)}
        if arch == "rotary":
            head_dim = config.hidden_size // config.num_heads
            out = {"rotary_full": rotary(seq, config.rope_full, head_dim)}
            if "sliding" in config.layer_types:  # ModernBERT's windowed layers ([S, S]: only then)
                out["rotary_sliding"] = rotary(seq, config.rope_sliding, head_dim)
                out["window"] = window_bias(seq, config.local_attention // 2)
            return out
        if arch == "disentangled" and self.relative is not None:
            rel = tf.cast(self.relative, tf.float32)
            rel = rel if self.relative_ln is None else self.relative_ln(rel)
            c2p, p2c = deberta_indices(seq, config)
            return {"relative": rel, "c2p": c2p, "p2c": p2c}
        return {}

    def _hidden(self, input_ids: tf.Tensor, attention_mask: tf.Tensor,
                token_type_ids: tf.Tensor, dropout_seed: tf.Tensor | None = None
                ) -> tf.Tensor:  # fmt: skip
        """Return the last hidden states ``[batch, seq, hidden]`` in float32."""
        batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        x, mask_bias = self._embed(input_ids, attention_mask, token_type_ids, dropout_seed)
        positions = self.positions(seq)
        for i, layer in enumerate(self.layers):
            layer_seed = None if dropout_seed is None else dropout_seed + tf.constant([0, i + 1])
            x = layer(x, mask_bias, batch, seq, layer_seed, positions)
        return tf.reshape(x, [batch, seq, -1])

    def layer_outputs(self, input_ids: tf.Tensor, attention_mask: tf.Tensor,
                      token_type_ids: tf.Tensor) -> list[tf.Tensor]:  # fmt: skip
        """Return the hidden states ``[batch, seq, hidden]`` (float32) after layers 1..L."""
        batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        x, mask_bias = self._embed(input_ids, attention_mask, token_type_ids)
        positions = self.positions(seq)
        out = []
        for layer in self.layers:
            x = layer(x, mask_bias, batch, seq, None, positions)
            out.append(tf.reshape(x, [batch, seq, -1]))
        return out

    def _position_ids(self, input_ids: tf.Tensor) -> tf.Tensor:
        """Return RoBERTa's position ids: pad + 1, pad + 2, ... over the non-pad tokens."""
        pad = self.config.pad_token_id
        real = tf.cast(tf.not_equal(input_ids, pad), tf.int32)
        return tf.cumsum(real, axis=1) * real + pad

    def _embed(self, input_ids: tf.Tensor, attention_mask: tf.Tensor, token_type_ids: tf.Tensor,
               dropout_seed: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor]:  # fmt: skip
        """Return the embeddings ``[batch * seq, hidden]`` and the attention mask's bias."""
        batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        x = tf.cast(tf.gather(self.word, input_ids), tf.float32)
        if self.position is not None and self.architecture.position_ids == "padded":
            ids = self._position_ids(input_ids)
            x = x + tf.cast(tf.gather(self.position, ids), tf.float32)
        elif self.position is not None:
            x = x + tf.cast(tf.gather(self.position, tf.range(seq)), tf.float32)[tf.newaxis]
        if self.token_type is not None:
            x = x + tf.cast(tf.gather(self.token_type, token_type_ids), tf.float32)
        if self.architecture.project_before_norm:  # DeBERTa: project, then norm
            if self.projection is not None:
                x = self.projection(x)
            x = self.embeddings_ln(x)
        else:  # ELECTRA, ALBERT: norm at the embedding width, then project
            x = self.embeddings_ln(x)
            if self.projection is not None:
                x = self.projection(x)
        if self.architecture.mask_embeddings:
            x = x * tf.cast(attention_mask, tf.float32)[:, :, tf.newaxis]
        x = tf.reshape(x, [batch * seq, -1])
        x = dropout(x, self.hidden_dropout, dropout_seed, 0)
        return x, mask_bias(attention_mask)

    def _pool(self, hidden: tf.Tensor, attention_mask: tf.Tensor) -> tf.Tensor:
        if self.sentence_head is not None:
            return self.sentence_head(hidden, attention_mask)
        return pool(hidden, attention_mask, self.pooling)

    def _encode(self, input_ids: tf.Tensor, attention_mask: tf.Tensor,
                token_type_ids: tf.Tensor) -> tf.Tensor:  # fmt: skip
        return self._pool(self._hidden(input_ids, attention_mask, token_type_ids), attention_mask)

    def _serve(self, input_ids: tf.Tensor, attention_mask: tf.Tensor,
               token_type_ids: tf.Tensor) -> dict[str, tf.Tensor]:  # fmt: skip
        hidden = self._hidden(input_ids, attention_mask, token_type_ids)
        if self.splade is not None:
            return dict(self.splade(hidden, attention_mask))
        if self.task == "embed" and self.retrieval is not None:
            return dict(self.retrieval(hidden, attention_mask))
        if self.task == "embed":
            return {"embedding": self._pool(hidden, attention_mask)}
        if self.zero_shot:
            unit = tf.math.l2_normalize(self._pool(hidden, attention_mask), axis=-1)
            logits = self.scale * tf.matmul(unit, self.label_matrix)
        else:
            logits = self.head(hidden, attention_mask=attention_mask)
        return head_outputs(self.task, logits, self.activation)

    def _serve_exits(self, input_ids: tf.Tensor, attention_mask: tf.Tensor,
                     token_type_ids: tf.Tensor, speed: tf.Tensor
                     ) -> dict[str, tf.Tensor]:  # fmt: skip
        """Run the layers with early exits; return logits, probabilities and exit_layer.

        The rule and both ways of serving it are export/exits.py's: with compaction the rows
        left are gathered after each layer, without it every row runs until the last has
        exited; the answers are the same. ``speed`` 0 exits nowhere: exactly the full model.
        """
        batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        threshold = speed_thresholds(checked_speed(speed, batch), self.exit_thresholds)
        x, _ = self._embed(input_ids, attention_mask, token_type_ids)
        serve = serve_compacted if self.compaction else serve_masked
        logits, exit_layer = serve(self, x, attention_mask, threshold, batch, seq)
        return {
            "logits": logits,
            "probabilities": tf.nn.softmax(logits, axis=-1),
            "exit_layer": exit_layer,
        }

    def head(self, hidden: tf.Tensor, dropout_seed: tf.Tensor | None = None,
             attention_mask: tf.Tensor | None = None) -> tf.Tensor:  # fmt: skip
        """Return a trained head's float32 logits: the architecture's dense (pooler tanh for
        BERT, dense tanh for RoBERTa, ReLU for DistilBERT, GELU for ELECTRA/DeBERTa, GELU + norm
        for ModernBERT) on [CLS] (or ModernBERT's mean) → dropout → classifier.

        A ``tag`` head: dropout → classifier on every token, ``[batch, seq, labels]``
        (ModernBERT's reads its dense + norm first).
        """
        if self.task == "tag":
            if self.architecture.tag_head_dense:
                hidden = self._head_dense(hidden)
            dropped = dropout(hidden, self.hidden_dropout, dropout_seed, 4)
            return token_logits(self.classifier, dropped)
        if self.config.classifier_pooling == "mean" and attention_mask is not None:
            vector = pool(hidden, attention_mask, "mean")
        else:
            vector = hidden[:, 0]
        pooled = dropout(self._head_dense(vector), self.hidden_dropout, dropout_seed, 4)
        return self.classifier(pooled)

    def _head_dense(self, x: tf.Tensor) -> tf.Tensor:
        if self.config.pooler_act == "tanh":  # BERT's pooler, as it always was
            pooled = tf.tanh(self.pooler(x))
        else:
            pooled = activation(self.config.pooler_act, self.pooler(x))
        return pooled if self.head_ln is None else self.head_ln(pooled)

    def logits(self, input_ids: tf.Tensor, attention_mask: tf.Tensor, token_type_ids: tf.Tensor,
               dropout_seed: tf.Tensor | None = None) -> tf.Tensor:  # fmt: skip
        """Return a trained head's float32 logits; ``dropout_seed`` (int32 ``[2]``) = training."""
        hidden = self._hidden(input_ids, attention_mask, token_type_ids, dropout_seed)
        return self.head(hidden, dropout_seed, attention_mask)

    def named_variables(self) -> dict[str, tf.Variable]:
        """Return every variable under its canonical name (the names the constructor takes)."""
        named: dict[str, Any] = {"embeddings/word": self.word}
        for name, var in (("embeddings/position", self.position),
                          ("embeddings/token_type", self.token_type),
                          ("relative/embeddings", self.relative),
                          ("relative/bias", self.relative_bias)):  # fmt: skip
            if var is not None:
                named[name] = var
        named.update(self.embeddings_ln.named_variables("embeddings_ln"))
        for prefix, module in (("embeddings/projection", self.projection),
                               ("relative_ln", self.relative_ln), ("final_ln", self.final_ln),
                               ("pooler", getattr(self, "pooler", None)),
                               ("head_ln", getattr(self, "head_ln", None)),
                               ("classifier", getattr(self, "classifier", None))):  # fmt: skip
            if module is not None:
                named.update(module.named_variables(prefix))
        for k, layer in enumerate(self.unique_layers):
            named.update({f"layer_{k}/{n}": v for n, v in layer.named_variables().items()})
        for k, student in enumerate(self.students):
            named.update({f"exit_{k}/{n}": v for n, v in student.named_variables().items()})
        return named

    def weights(self) -> dict[str, np.ndarray]:
        """Return the current weights in the canonical names the constructor takes (float32)."""
        return {k: tf.cast(v, tf.float32).numpy() for k, v in self.named_variables().items()}

    def signatures(
        self, bucket_lens: Sequence[int] = (), subsets: Mapping[str, Sequence[str]] | None = None
    ) -> dict[str, Any]:
        """Return the signatures to save: ``serving_default`` and one ``seq_<L>`` per bucket,
        and beside each, one per entry of ``subsets`` (suffix -> output names) returning only
        those outputs (modelformat/outputs.py ``kind_signatures``).

        TF Serving's batching keeps one queue per signature (distinct feed/fetch tensors), so
        a fixed-length signature per bucket lets requests of one length batch together with
        no padding (TF Serving pads with each task's first element, which changes BERT's
        outputs). Each is its own traced function over the same variables; a subset signature
        calls its base's function (one graph in the SavedModel, not one per subset).
        """
        from modelformat.outputs import subset_signature

        bases = {"serving_default": self.serve}
        for seq_len in bucket_lens:
            bases[signature_name(seq_len)] = tf.function(
                self._serving_fn(), input_signature=self._specs(seq_len), autograph=False
            )
        out = {}
        for base, fn in bases.items():
            out[base] = fn.get_concrete_function()
            for suffix, names in (subsets or {}).items():
                out[subset_signature(base, suffix)] = _narrowed(fn, names).get_concrete_function()
        return out


def _narrowed(fn: Any, names: Sequence[str]) -> Any:
    """Return a ``tf.function`` of ``fn``'s input signature returning only its ``names``."""
    keep = tuple(names)

    def call(*args: tf.Tensor) -> dict[str, tf.Tensor]:
        outputs = fn(*args)
        return {name: outputs[name] for name in keep}

    return tf.function(call, input_signature=fn.input_signature, autograph=False)


def _layer_weights(weights: Mapping[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    return _prefixed(weights, f"layer_{index}/")


def _prefixed(weights: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}


def run(fn: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Call a ``tf.function`` / signature with numpy inputs and return numpy outputs.

    The three token inputs go in as int32; ``speed``, when given, as float32.
    """
    feeds = {name: tf.constant(np.asarray(inputs[name], dtype=np.int32)) for name in INPUT_NAMES}
    if SPEED in inputs:
        feeds[SPEED] = tf.constant(np.asarray(inputs[SPEED], dtype=np.float32))
    out = fn(**feeds)
    if isinstance(out, dict):
        return {name: value.numpy() for name, value in out.items()}
    return {"output": out.numpy()}

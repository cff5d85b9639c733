"""SPLADE checkpoints (sentence-transformers 5+ ``SparseEncoder``): read at export, no TensorFlow.

Two layouts, as sentence-transformers saves them:

- **SPLADE**: ``modules.json`` lists ``MLMTransformer`` (sentence-transformers 6: a
  ``Transformer`` whose ``sentence_bert_config.json`` says ``transformer_task: fill-mask``) at
  the root (``path ""``: config.json, model.safetensors and the tokenizer of a
  ``...ForMaskedLM`` checkpoint) and ``SpladePooling``
  (``1_SpladePooling/config.json``: ``pooling_strategy`` max|sum, ``activation_function``
  relu|log1p_relu); ``config_sentence_transformers.json`` says ``model_type: SparseEncoder``.
- **Inference-free** (OpenSearch's doc-only models): one ``Router`` module whose
  ``router_config.json`` routes ``query`` to a ``SparseStaticEmbedding`` (its
  ``model.safetensors`` ``weight [vocab]``: one IDF weight per token id; older revisions keep an
  ``idf.json`` ``{token: weight}`` instead) and ``document`` to ``MLMTransformer`` +
  ``SpladePooling`` in their own directories.

``read_splade`` returns what the export serves (None for any other checkpoint);
``read_mlm_head`` reads the masked-LM head's weights by the architecture's table
(export/architectures/, ``MaskedLMHead``), the decoder being the word embeddings when tied.
The graph is export/splade_head.py's; the gateway reads model.json's ``outputs.sparse``
(modelformat/outputs.py) and, for queries of an inference-free model, the IDF asset
(modelformat/sparse_idf.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from export.architectures import architecture
from export.config import BertConfig
from export.errors import ExportError
from export.names import TensorName
from modelformat.outputs import SPLADE_ACTIVATIONS, SPLADE_POOLINGS, SparseOutput
from modelformat.sparse_idf import IDF_ASSET

DEFAULT_TOP_K = 256
MLM = "MLMTransformer"
POOLING = "SpladePooling"
STATIC = "SparseStaticEmbedding"


@dataclass
class SpladeCheckpoint:
    """What a SPLADE checkpoint serves: where its masked-LM model is, how it pools, its queries."""

    model_dir: Path  # the MLMTransformer's directory (config.json, model.safetensors, tokenizer)
    pooling: str = "max"
    activation: str = "relu"
    query_idf: np.ndarray | None = None  # inference-free: the query side's weight per token id
    query_source: str | None = None  # the file the IDF table came from
    prompts: dict[str, str] = field(default_factory=dict)

    @property
    def inference_free(self) -> bool:
        """Return whether queries are answered from the IDF table (no model call)."""
        return self.query_idf is not None

    def output(self, top_k: int, vocab_size: int) -> SparseOutput:
        """Return model.json's ``outputs.sparse`` (modelformat/outputs.py)."""
        return SparseOutput(
            form="topk", top_k=top_k, vocab_size=vocab_size, pooling=self.pooling,
            activation=self.activation, query_form="idf" if self.inference_free else None,
            query_asset=IDF_ASSET if self.inference_free else None,
        )  # fmt: skip


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ExportError(f"missing file: {path}") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"cannot read {path}: {exc}") from exc


def _kind(type_path: Any) -> str:
    """Return a module's class name from its type path (``...models.SpladePooling`` → that)."""
    return str(type_path or "").rsplit(".", 1)[-1]


def is_splade(path: str | Path) -> bool:
    """Return whether ``path`` is a sentence-transformers SparseEncoder directory."""
    path = Path(path)
    modules = path / "modules.json"
    if not path.is_dir() or not modules.is_file():
        return False
    try:
        kinds = {_kind(m.get("type")) for m in json.loads(modules.read_text(encoding="utf-8"))}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError, TypeError):
        return False
    config = path / "config_sentence_transformers.json"
    sparse = False
    if config.is_file():
        try:
            sparse = json.loads(config.read_text(encoding="utf-8")).get("model_type") == (
                "SparseEncoder"
            )
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            sparse = False
    return sparse or bool(kinds & {MLM, POOLING})


def _pooling(path: Path) -> tuple[str, str]:
    config = _json(path / "config.json")
    if not isinstance(config, dict):
        raise ExportError(f"{path / 'config.json'}: expected a JSON object")
    pooling = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if pooling not in SPLADE_POOLINGS:
        raise ExportError(f"{path / 'config.json'}: pooling_strategy {pooling!r} is not served "
                          f"(served: {', '.join(SPLADE_POOLINGS)})")  # fmt: skip
    if activation not in SPLADE_ACTIVATIONS:
        raise ExportError(f"{path / 'config.json'}: activation_function {activation!r} is not "
                          f"served (served: {', '.join(SPLADE_ACTIVATIONS)})")  # fmt: skip
    return str(pooling), str(activation)


def _masked_lm(kind: str, folder: Path) -> str:
    """Return ``MLM`` for sentence-transformers 6's ``Transformer`` with ``transformer_task``
    fill-mask (6.x's spelling of MLMTransformer) at ``folder``, else ``kind``."""
    config = folder / "sentence_bert_config.json"
    if (
        kind == "Transformer"
        and config.is_file()
        and ((_json(config) or {}).get("transformer_task") == "fill-mask")
    ):
        return MLM
    return kind


def _splade_side(root: Path, modules: list[tuple[str, Path]], where: Path) -> SpladeCheckpoint:
    """Return the SPLADE side of ``modules`` ((class, directory) in order): MLM then pooling."""
    kinds = [_masked_lm(k, folder) for k, folder in modules]
    if kinds != [MLM, POOLING]:
        raise ExportError(
            f"{where}: SPLADE is MLMTransformer then SpladePooling, got {kinds or 'nothing'} "
            "(a SparseAutoEncoder or CSR model is not served)"
        )
    pooling, activation = _pooling(modules[1][1])
    bert_config = modules[0][1] / "sentence_bert_config.json"
    if bert_config.is_file() and (_json(bert_config) or {}).get("do_lower_case"):
        raise ExportError(f"{bert_config}: do_lower_case true (sentence-transformers lower-cases "
                          "the text before its tokenizer) is not served")  # fmt: skip
    return SpladeCheckpoint(model_dir=modules[0][1], pooling=pooling, activation=activation)


def _idf_from_safetensors(path: Path) -> np.ndarray:
    from safetensors.numpy import load_file

    try:
        weight = load_file(str(path)).get("weight")
    except Exception as exc:  # safetensors raises its own error types
        raise ExportError(f"cannot read {path}: {exc}") from exc
    if weight is None or weight.ndim != 1:
        raise ExportError(f"{path}: expected one tensor 'weight' [vocab] (the IDF table)")
    return np.asarray(weight, dtype=np.float32)


def _query_side(root: Path, modules: list[tuple[str, Path]], where: Path) -> tuple[Path, Path]:
    """Return (the query module's directory, its IDF file) of an inference-free model."""
    kinds = [k for k, _ in modules]
    if len(modules) != 1 or kinds[0] not in (STATIC, "IDF"):
        raise ExportError(f"{where}: an inference-free query side is one SparseStaticEmbedding, "
                          f"got {kinds or 'nothing'}")  # fmt: skip
    folder = modules[0][1]
    for candidate in (folder / "model.safetensors", folder / "idf.json", root / "idf.json"):
        if candidate.is_file():
            return folder, candidate
    raise ExportError(f"{folder}: no model.safetensors (weight [vocab]) nor idf.json")


def read_splade(path: str | Path) -> SpladeCheckpoint | None:
    """Return the SPLADE checkpoint at ``path``: None when it is not a SparseEncoder directory;
    ExportError naming the file for a layout or setting that is not served."""
    root = Path(path)
    if not is_splade(root):
        return None
    listed = _json(root / "modules.json")
    if not isinstance(listed, list):
        raise ExportError(f"{root / 'modules.json'}: expected a list of modules")
    modules = [(_kind(m.get("type")), root / str(m.get("path", "")))
               for m in sorted(listed, key=lambda m: int(m.get("idx", 0)))]  # fmt: skip
    if [k for k, _ in modules] == ["Router"]:
        found = _router(root, modules[0][1])
    else:
        found = _splade_side(root, modules, root / "modules.json")
    found.prompts = _prompts(root / "config_sentence_transformers.json")
    return found


def _router(root: Path, folder: Path) -> SpladeCheckpoint:
    config_path = folder / "router_config.json"
    config = _json(config_path)
    types = config.get("types") or {}
    structure = config.get("structure") or {}
    if not isinstance(types, dict) or not isinstance(structure, dict):
        raise ExportError(f"{config_path}: types and structure must be objects")

    def side(name: str) -> list[tuple[str, Path]]:
        return [(_kind(types.get(key)), folder / key) for key in structure.get(name) or []]

    document = next((side(k) for k in ("document", "passage", "corpus") if side(k)), [])
    found = _splade_side(root, document, config_path)
    query_dir, source = _query_side(root, side("query"), config_path)
    found.query_source = str(source)
    if source.suffix == ".safetensors":
        found.query_idf = _idf_from_safetensors(source)
    else:  # the older {token: weight} form: ids from the query side's (or the model's) vocabulary
        found.query_idf = _idf_from_tokens(source, query_dir, found.model_dir)
    return found


def _idf_from_tokens(source: Path, *folders: Path) -> np.ndarray:
    """Return an ``idf.json`` ``{token: weight}`` as weights per token id (the tokenizer's)."""
    table = _json(source)
    if not isinstance(table, dict):
        raise ExportError(f"{source}: expected {{token: weight}}")
    tokenizer = next((f / "tokenizer.json" for f in folders if (f / "tokenizer.json").is_file()),
                     None)  # fmt: skip
    if tokenizer is None:
        raise ExportError(f"{source}: no tokenizer.json beside it to map its tokens to ids")
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab(with_added_tokens=True)
    weights = np.zeros(max(vocab.values()) + 1, np.float32)
    known = [(vocab[t], float(w)) for t, w in table.items() if t in vocab]
    if not known:
        raise ExportError(f"{source}: none of its tokens is in {tokenizer}")
    for i, w in known:
        weights[i] = w
    return weights


def _prompts(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    prompts = _json(path).get("prompts") or {}
    if not isinstance(prompts, dict):
        raise ExportError(f"{path}: prompts must map names to strings")
    return {str(k): str(v) for k, v in prompts.items()}


def check_tokenizers(found: SpladeCheckpoint) -> None:
    """Raise ExportError when an inference-free model's query side tokenizes unlike its
    document side (the gateway tokenizes queries with the served model's tokenizer)."""
    if found.query_source is None:
        return
    query = Path(found.query_source).parent / "tokenizer.json"
    document = found.model_dir / "tokenizer.json"
    if query.is_file() and document.is_file():
        a, b = (json.loads(p.read_text(encoding="utf-8")) for p in (query, document))
        if a.get("model") != b.get("model") or a.get("normalizer") != b.get("normalizer"):
            raise ExportError(f"{query} differs from {document}: the query side's tokenizer "
                              "must be the document model's")  # fmt: skip


def read_mlm_head(model_dir: Path, config: BertConfig, word: np.ndarray) -> dict[str, np.ndarray]:
    """Return the masked-LM head's weights (canonical ``mlm/*`` names, kernels ``[in, out]``,
    the decoder ``[vocab, width]``): the word table ``word`` where the decoder is tied (config.json
    ``tie_word_embeddings``, default true, or no decoder tensor in the file), its bias the head's
    own or the decoder's (zeros when the file has neither). ExportError naming the tensor."""
    from safetensors import safe_open

    from export.checkpoint import _collect, read_bf16_tensor

    data = _json(model_dir / "config.json")
    arch = architecture(config.model_type)
    if arch.mlm is None:
        raise ExportError(f"{model_dir / 'config.json'}: {arch.title} has no masked-LM head")
    names: list[TensorName] = arch.mlm.names(config, data)
    weights_path = model_dir / "model.safetensors"
    with safe_open(str(weights_path), framework="numpy") as handle:
        keys = set(handle.keys())
        if names[0].source not in keys:
            raise ExportError(
                f"{weights_path}: no masked-LM head ({names[0].source}): a SPLADE model is a "
                f"{arch.mlm.cls} checkpoint (an {arch.title} base model has none)"
            )

        def fetch(spec: TensorName) -> tuple[str, np.ndarray | None]:
            if spec.source not in keys:
                return spec.source, None
            try:
                return spec.source, np.asarray(handle.get_tensor(spec.source))
            except TypeError:  # numpy has no bfloat16
                return spec.source, read_bf16_tensor(weights_path, spec.source)

        head = _collect(config, names, fetch, str(weights_path))
    tied = bool(data.get("tie_word_embeddings", True)) or "mlm/decoder" not in head
    if tied:
        width = head["mlm/ln/gamma"].shape[0]
        if word.shape[1] != width:
            raise ExportError(f"{weights_path}: a tied decoder needs the word embeddings' width "
                              f"{word.shape[1]} at the head, got {width}")  # fmt: skip
        head["mlm/decoder"] = word
    bias = head.pop("mlm/bias", None)
    decoder_bias = head.pop("mlm/decoder_bias", None)
    chosen = bias if bias is not None else decoder_bias
    head["mlm/bias"] = (np.zeros(config.vocab_size, np.float32) if chosen is None
                        else chosen)  # fmt: skip
    head["mlm/tied"] = np.asarray(tied)
    return head


@dataclass
class SpladeSpec:
    """What the graph's SPLADE head is built from (export/splade_head.py)."""

    weights: dict[str, np.ndarray]  # read_mlm_head's
    pooling: str
    activation: str  # SpladePooling's: relu | log1p_relu
    transform_act: str  # the masked-LM head transform's
    top_k: int
    eps: float


def splade_spec(found: SpladeCheckpoint, config: BertConfig, word: np.ndarray,
                top_k: int) -> SpladeSpec:  # fmt: skip
    """Return the graph's head spec of ``found`` (its masked-LM head read, ``top_k`` checked)."""
    arch = architecture(config.model_type)
    assert arch.mlm is not None  # read_mlm_head refuses an architecture without one
    weights = read_mlm_head(found.model_dir, config, word)
    return SpladeSpec(weights=weights, pooling=found.pooling, activation=found.activation,
                      transform_act=arch.mlm.activation(config), top_k=top_k,
                      eps=config.layer_norm_eps)  # fmt: skip


def choose_top_k(asked: int | None, vocab_size: int) -> int:
    """Return the graph's k: the one asked (1..vocab), else ``DEFAULT_TOP_K`` cut to the vocab."""
    if asked is None:
        return min(DEFAULT_TOP_K, vocab_size)
    if not 1 <= asked <= vocab_size:
        raise ExportError(f"top_k must be in [1, {vocab_size}] (the vocabulary), got {asked}")
    return asked


def splade_checkpoint(checkpoint: str | Path, task: str, top_k: int | None
                      ) -> SpladeCheckpoint | None:  # fmt: skip
    """Return ``checkpoint``'s SPLADE layout (None: not one); ExportError for a SPLADE checkpoint
    exported as another task, or ``top_k`` asked of a model that is not SPLADE."""
    found = read_splade(checkpoint)
    if found is None:
        if top_k is not None:
            raise ExportError(f"{checkpoint}: --top-k is for SPLADE checkpoints "
                              "(a sentence-transformers SparseEncoder), not this one")  # fmt: skip
        return None
    if task != "embed":
        raise ExportError(f"{checkpoint}: a SPLADE SparseEncoder answers sparse vectors: export "
                          f"it with --task embed, not {task}")  # fmt: skip
    check_tokenizers(found)
    return found


def model_json_entries(found: SpladeCheckpoint, top_k: int, vocab_size: int) -> dict[str, Any]:
    """Return model.json's SPLADE keys: ``outputs`` (the sparse kind, modelformat/outputs.py),
    ``pooling`` and, when the checkpoint has non-empty prompts, ``sentence_transformers``."""
    from export.sentence_modules import SentenceModules
    from modelformat.outputs import Outputs

    entries: dict[str, Any] = {
        "outputs": Outputs(sparse=found.output(top_k, vocab_size)).to_info(),
        "pooling": f"splade_{found.pooling}",
    }
    prompts = {k: v for k, v in found.prompts.items() if v}
    if prompts:
        modules = SentenceModules(poolings=[f"splade_{found.pooling}"], prompts=prompts)
        entries["sentence_transformers"] = modules.model_json_entry()
    return entries


def write_idf_asset(temp: Path, found: SpladeCheckpoint, vocab_size: int,
                    added_ids: tuple[int, ...] = ()) -> None:  # fmt: skip
    """Write the inference-free query side's IDF table as ``assets/sparse_idf.json``.

    ``added_ids`` (the specials the tokenizer adds around a text: [CLS]/[SEP], <s>/</s>) weigh 0
    there: ``SparseStaticEmbedding`` tokenizes queries without them (``add_special_tokens=False``)
    while the gateway's tokenizer adds them, so a 0 weight leaves them out of the answer.
    """
    from modelformat.sparse_idf import idf_entry

    if found.query_idf is None:
        return
    if len(found.query_idf) > vocab_size:
        raise ExportError(f"{found.query_source}: {len(found.query_idf)} weights for a "
                          f"vocabulary of {vocab_size}")  # fmt: skip
    (temp / "assets").mkdir(exist_ok=True)
    weights = found.query_idf.copy()
    weights[[i for i in added_ids if 0 <= i < len(weights)]] = 0.0
    text = json.dumps(idf_entry(weights), separators=(",", ":"))
    (temp / "assets" / IDF_ASSET).write_text(text + "\n", encoding="utf-8")

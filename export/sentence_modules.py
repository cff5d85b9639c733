"""sentence-transformers checkpoints: their modules read at export, applied in the graph.

A sentence-transformers directory (bge, e5, gte, all-MiniLM, ...) says how it encodes in
``modules.json``: the Transformer, then ``Pooling`` (``1_Pooling/config.json``: cls, mean, max,
mean_sqrt_len, lasttoken, several of them concatenated in sentence-transformers' order), an
optional ``Dense`` (``2_Dense/config.json`` + its weights: a linear layer and its activation)
and an optional ``Normalize``; ``config_sentence_transformers.json`` holds the prompts and the
default prompt. ``read_sentence_modules`` reads them (ExportError naming the file for what it
can't serve); ``SentenceHead`` is the graph's pooling -> dense -> normalize, as
``SentenceTransformer.encode`` runs them; ``model_json_entry`` is what model.json records for
the gateway (prompts, whether the vectors come out normalized).

A PyLate ColBERT directory is a sentence-transformers directory too: the Transformer, then
PyLate's ``pylate.models.Dense.Dense`` modules (the same config.json and ``linear.weight`` as
sentence-transformers' Dense, plus ``use_residual``) and no Pooling: every token keeps its vector.
``read_pylate_modules`` reads it (its ColBERT settings in ``config_sentence_transformers.json``:
prefixes, lengths, expansion, skiplist); export/retrieval.py serves it.

sentence-transformers 6 saves the same modules under new class paths
(``sentence_transformers.base.modules.transformer.Transformer``,
``...sentence_transformer.modules.pooling.Pooling``, ``...base.modules.dense.Dense`` with
``module_input_name``, ``...base.modules.normalize.Normalize``): modules are read by their class
name, whatever the path. Its Pooling writes ``pooling_mode`` (a name, or a list of them
concatenated in the order listed) where 5.x wrote one ``pooling_mode_*`` flag per mode. Its
``MultiVectorEncoder`` (PyLate's ColBERT, absorbed) is the Transformer (``query_length``,
``document_length``, ``query_expansion`` in ``sentence_bert_config.json``), a token-level Dense,
a ``MultiVectorMask`` (the skiplist) and Normalize, its markers the ``query``/``document`` prompts;
``read_multivector_modules`` reads it into the same ``PylateModules``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from export.errors import ExportError

# sentence-transformers' Pooling concatenates its modes in this order
POOLING_KEYS = (
    ("cls", "pooling_mode_cls_token"),
    ("max", "pooling_mode_max_tokens"),
    ("mean", "pooling_mode_mean_tokens"),
    ("mean_sqrt_len", "pooling_mode_mean_sqrt_len_tokens"),
    ("weightedmean", "pooling_mode_weightedmean_tokens"),
    ("lasttoken", "pooling_mode_lasttoken"),
)
SERVED_POOLINGS = ("cls", "max", "mean", "mean_sqrt_len", "lasttoken")
# Pooling's pooling_mode names (sentence-transformers 6 writes these) -> the graph's
POOLING_NAMES = {"cls_token": "cls", "mean_tokens": "mean", "max_tokens": "max",
                 "mean_sqrt_len_tokens": "mean_sqrt_len"}  # fmt: skip
# Dense's activation_function (a torch class path) -> the graph's
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
}
MAX_PROMPT_CHARS = 2000
PYLATE_DENSE = "pylate.models.Dense.Dense"
# PyLate's ColBERT defaults where config_sentence_transformers.json leaves a key out
# (pylate/models/colbert.py); skiplist_words' default is string.punctuation
PYLATE_DEFAULTS: dict[str, Any] = {
    "query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32,
    "document_length": 180, "attend_to_expansion_tokens": False, "do_query_expansion": True,
}  # fmt: skip


@dataclass
class DenseLayer:
    """A sentence-transformers Dense module: ``activation(x @ kernel + bias)``."""

    kernel: np.ndarray  # [in, out]
    bias: np.ndarray | None
    activation: str


@dataclass
class SentenceModules:
    """What a sentence-transformers checkpoint does after its Transformer."""

    poolings: list[str]
    include_prompt: bool = True
    dense: list[DenseLayer] = field(default_factory=list)
    normalize: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None

    def model_json_entry(self) -> dict[str, Any]:
        """Return model.json's ``sentence_transformers`` entry (the gateway reads prompts and
        ``normalize``; the rest says what the graph does)."""
        return {
            "pooling": self.poolings,
            "include_prompt": self.include_prompt,
            "dense": [
                {
                    "in": int(d.kernel.shape[0]),
                    "out": int(d.kernel.shape[1]),
                    "activation": d.activation,
                }
                for d in self.dense
            ],
            "normalize": self.normalize,
            "prompts": self.prompts,
            "default_prompt_name": self.default_prompt_name,
        }


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ExportError(f"missing file: {path} (named by modules.json)") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"cannot read {path}: {exc}") from exc


def _pooling(path: Path) -> tuple[list[str], bool]:
    config = _json(path / "config.json")
    if not isinstance(config, dict):
        raise ExportError(f"{path / 'config.json'}: expected a JSON object")
    mode = config.get("pooling_mode")
    if mode is not None:  # sentence-transformers 6: names, concatenated in the order listed
        names = [mode] if isinstance(mode, str) else mode
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ExportError(f"{path / 'config.json'}: pooling_mode must be a name or a list of "
                              f"names, got {mode!r}")  # fmt: skip
        modes = [POOLING_NAMES.get(str(n), str(n)) for n in names]
    else:  # 5.x: one flag per mode, concatenated in POOLING_KEYS' order
        modes = [name for name, key in POOLING_KEYS if config.get(key)]
    unknown = [m for m in modes if m not in SERVED_POOLINGS]
    if unknown or not modes:
        raise ExportError(
            f"{path / 'config.json'}: pooling {unknown or 'none'} is not served (served: "
            f"{', '.join(SERVED_POOLINGS)})"
        )
    return modes, bool(config.get("include_prompt", True))


def _dense(path: Path, width: int, reads: str | None = None) -> DenseLayer:
    """Return the Dense module at ``path``; ``reads`` is the feature it must apply to
    (sentence-transformers 6's ``module_input_name``: ``sentence_embedding`` after a Pooling,
    ``token_embeddings`` in a multi-vector model; 5.x's configs name none)."""
    config = _json(path / "config.json")
    if not isinstance(config, dict):
        raise ExportError(f"{path / 'config.json'}: expected a JSON object")
    names = {str(config[k]) for k in ("module_input_name", "module_output_name") if config.get(k)}
    if reads is not None and names - {reads}:
        raise ExportError(f"{path / 'config.json'}: a Dense on {sorted(names)} is not served "
                          f"here (served: {reads})")  # fmt: skip
    if config.get("use_residual"):  # PyLate's Dense may add its input back: not served
        raise ExportError(f"{path / 'config.json'}: use_residual true is not served")
    activation = ACTIVATIONS.get(str(config.get("activation_function")))
    if activation is None:
        raise ExportError(
            f"{path / 'config.json'}: activation {config.get('activation_function')!r} is not "
            f"served (served: {', '.join(ACTIVATIONS)})"
        )
    weights = path / "model.safetensors"
    if not weights.is_file():
        found = [p.name for p in path.glob("*.bin")]
        raise ExportError(
            f"missing weights file: {weights}"
            + (f" (found {found}; convert it to safetensors)" if found else "")
        )
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(weights))
    except Exception as exc:  # safetensors raises its own error types
        raise ExportError(f"cannot read {weights}: {exc}") from exc
    kernel = tensors.get("linear.weight")
    if kernel is None:
        raise ExportError(f"{weights}: missing tensor linear.weight")
    if kernel.ndim != 2 or kernel.shape[1] != width:
        raise ExportError(f"{weights}: linear.weight has shape {list(kernel.shape)}, expected "
                          f"[out, {width}]")  # fmt: skip
    bias = tensors.get("linear.bias")
    if bool(config.get("bias", True)) and bias is None:
        raise ExportError(f"{weights}: missing tensor linear.bias")
    return DenseLayer(
        kernel=np.ascontiguousarray(kernel.T, dtype=np.float32),
        bias=None if bias is None else np.asarray(bias, dtype=np.float32),
        activation=activation,
    )


def read_sentence_modules(path: str | Path, hidden_size: int) -> SentenceModules | None:
    """Return the modules of the sentence-transformers checkpoint at ``path`` (None when it has
    no modules.json: not one). ``hidden_size`` is the Transformer's output width."""
    path = Path(path)
    if not (path / "modules.json").is_file():
        return None
    modules = _json(path / "modules.json")
    if not isinstance(modules, list):
        raise ExportError(f"{path / 'modules.json'}: expected a list of modules")
    found = SentenceModules(poolings=[])
    width = hidden_size
    for module in sorted(modules, key=lambda m: int(m.get("idx", 0))):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        where = path / str(module.get("path", ""))
        if kind == "Transformer":
            continue
        if kind == "Pooling":
            found.poolings, found.include_prompt = _pooling(where)
            width = hidden_size * len(found.poolings)
        elif kind == "Dense":
            if not found.poolings:  # the graph applies Dense to the pooled vector
                raise ExportError(f"{path / 'modules.json'}: a Dense before the Pooling (on "
                                  "token embeddings) is not served")  # fmt: skip
            layer = _dense(where, width, "sentence_embedding")
            found.dense.append(layer)
            width = int(layer.kernel.shape[1])
        elif kind == "Normalize":
            found.normalize = True
        else:
            raise ExportError(
                f"{path / 'modules.json'}: module {module.get('type')!r} is not served "
                "(served: Transformer, Pooling, Dense, Normalize)"
            )
    if not found.poolings:
        raise ExportError(f"{path / 'modules.json'}: no Pooling module")
    _prompts(path / "config_sentence_transformers.json", found)
    return found


@dataclass
class PylateModules:
    """What a PyLate ColBERT checkpoint does after its Transformer, and its ColBERT settings."""

    dense: list[DenseLayer]
    settings: dict[str, Any]  # PYLATE_DEFAULTS' keys and skiplist_words, as PyLate resolves them


def is_pylate(path: str | Path) -> bool:
    """Return whether ``path`` is a PyLate ColBERT directory (a modules.json naming PyLate's
    modules, or config_sentence_transformers.json's model_type ColBERT)."""
    path = Path(path)
    if not (path / "modules.json").is_file():
        return False
    modules = _json(path / "modules.json")
    if isinstance(modules, list) and any(
        str(m.get("type", "")).startswith("pylate.") for m in modules if isinstance(m, dict)
    ):
        return True
    st_config = path / "config_sentence_transformers.json"
    return st_config.is_file() and _json(st_config).get("model_type") == "ColBERT"


def read_pylate_modules(path: str | Path, hidden_size: int) -> PylateModules:
    """Return the Dense projections and ColBERT settings of the PyLate directory ``path``."""
    import string

    path = Path(path)
    modules = _json(path / "modules.json")
    if not isinstance(modules, list):
        raise ExportError(f"{path / 'modules.json'}: expected a list of modules")
    dense: list[DenseLayer] = []
    width = hidden_size
    for module in sorted(modules, key=lambda m: int(m.get("idx", 0))):
        kind = str(module.get("type", ""))
        if kind.rsplit(".", 1)[-1] == "Transformer":
            continue
        if kind not in (PYLATE_DENSE, "sentence_transformers.models.Dense"):
            raise ExportError(
                f"{path / 'modules.json'}: module {kind!r} is not served in a ColBERT "
                f"checkpoint (served: Transformer, {PYLATE_DENSE})"
            )
        layer = _dense(path / str(module.get("path", "")), width)
        dense.append(layer)
        width = int(layer.kernel.shape[1])
    if not dense:
        raise ExportError(f"{path / 'modules.json'}: a ColBERT checkpoint without its Dense "
                          "projection")  # fmt: skip
    st_path = path / "config_sentence_transformers.json"
    config = _json(st_path) if st_path.is_file() else {}
    settings: dict[str, Any] = {k: config.get(k) if config.get(k) is not None else v
                for k, v in PYLATE_DEFAULTS.items()}  # fmt: skip
    words = config.get("skiplist_words")
    settings["skiplist_words"] = list(string.punctuation) if words is None else words
    if not all(isinstance(w, str) for w in settings["skiplist_words"]):
        raise ExportError(f"{st_path}: skiplist_words must be a list of strings")
    for key in ("query_length", "document_length"):
        if not isinstance(settings[key], int) or settings[key] < 2:
            raise ExportError(f"{st_path}: {key} must be an integer of at least 2")
    return PylateModules(dense=dense, settings=settings)


MULTIVECTOR_ENCODER = "MultiVectorEncoder"
MULTIVECTOR_MASK = "MultiVectorMask"


def is_multivector_encoder(path: str | Path) -> bool:
    """Return whether ``path`` is a sentence-transformers 6 ``MultiVectorEncoder`` directory (a
    modules.json with a MultiVectorMask, or config_sentence_transformers.json's model_type)."""
    path = Path(path)
    if not (path / "modules.json").is_file():
        return False
    modules = _json(path / "modules.json")
    if isinstance(modules, list) and any(
        str(m.get("type", "")).rsplit(".", 1)[-1] == MULTIVECTOR_MASK
        for m in modules
        if isinstance(m, dict)
    ):
        return True
    st_config = path / "config_sentence_transformers.json"
    return st_config.is_file() and _json(st_config).get("model_type") == MULTIVECTOR_ENCODER


def _expansion(path: Path, value: Any) -> dict[str, Any] | None:
    """Return the Transformer's ``query_expansion`` (None: off) as the graph serves it: the
    ``fixed`` strategy (every query padded or cut to ``length``); ``min`` is not served."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("strategy") != "fixed":
        raise ExportError(f"{path}: query_expansion {value!r} is not served (served: strategy "
                          "fixed, or none)")  # fmt: skip
    length, token = value.get("length"), value.get("token")
    if not isinstance(length, int) or isinstance(length, bool) or length < 2:
        raise ExportError(f"{path}: query_expansion length must be an integer of at least 2")
    if token is not None and not isinstance(token, str):
        raise ExportError(f"{path}: query_expansion token must be a string")
    return {"attend": bool(value.get("attend", False)), "token": token, "length": length}


def _mask_words(path: Path) -> list[str]:
    """Return a MultiVectorMask's skiplist words (documents only, as the gateway skips them)."""
    config = _json(path / "config.json")
    if not isinstance(config, dict):
        raise ExportError(f"{path / 'config.json'}: expected a JSON object")
    tasks = config.get("skiplist_tasks", ["document"])
    tasks = [tasks] if isinstance(tasks, str) else list(tasks or [])
    if set(tasks) - {"document"}:
        raise ExportError(f"{path / 'config.json'}: skiplist_tasks {tasks} is not served (served: "
                          "document: a query keeps every token)")  # fmt: skip
    if config.get("keep_only_token_ids"):
        raise ExportError(f"{path / 'config.json'}: keep_only_token_ids is not served")
    words = (config.get("skiplist_words") or []) if tasks else []
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise ExportError(f"{path / 'config.json'}: skiplist_words must be a list of strings")
    return words


def read_multivector_modules(path: str | Path, hidden_size: int) -> PylateModules:
    """Return the token-level Dense projections and ColBERT settings of the sentence-transformers 6
    ``MultiVectorEncoder`` directory ``path``: Transformer (at the root), Dense..., MultiVectorMask,
    Normalize. ``settings`` holds PYLATE_DEFAULTS' keys as this layout states them (prefixes are
    the ``query`` / ``document`` prompts), ``skiplist_words``, ``expansion_token`` (None: the
    tokenizer's mask token) and ``score`` (``sum``: maxsim, ``mean``: meanmaxsim)."""
    path = Path(path)
    modules = _json(path / "modules.json")
    if not isinstance(modules, list):
        raise ExportError(f"{path / 'modules.json'}: expected a list of modules")
    served = "Transformer (the root), Dense, MultiVectorMask, Normalize"
    kinds: list[str] = []
    dense: list[DenseLayer] = []
    words: list[str] | None = None
    width = hidden_size
    for module in sorted(modules, key=lambda m: int(m.get("idx", 0))):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        where = path / str(module.get("path", ""))
        if kind == "Transformer" and not kinds and where == path:
            pass
        elif kind == "Dense" and kinds[-1:] in (["Transformer"], ["Dense"]):
            layer = _dense(where, width, "token_embeddings")
            dense.append(layer)
            width = int(layer.kernel.shape[1])
        elif kind == MULTIVECTOR_MASK and "Dense" in kinds and MULTIVECTOR_MASK not in kinds:
            words = _mask_words(where)
        elif kind == "Normalize" and kinds[-1:] in (["Dense"], [MULTIVECTOR_MASK]):
            pass
        else:
            raise ExportError(f"{path / 'modules.json'}: module {module.get('type')!r} after "
                              f"{kinds or 'nothing'} is not served in a MultiVectorEncoder "
                              f"(served, in order: {served})")  # fmt: skip
        kinds.append(kind)
    if words is None or "Normalize" not in kinds:
        raise ExportError(f"{path / 'modules.json'}: a MultiVectorEncoder without its Dense, "
                          f"MultiVectorMask and Normalize is not served (served, in order: "
                          f"{served})")  # fmt: skip
    bert_path = path / "sentence_bert_config.json"
    bert = _json(bert_path) if bert_path.is_file() else {}
    expansion = _expansion(bert_path, bert.get("query_expansion"))
    st_path = path / "config_sentence_transformers.json"
    st_config = _json(st_path) if st_path.is_file() else {}
    prompts = st_config.get("prompts") or {}
    document = next((prompts[k] for k in ("document", "passage", "corpus") if k in prompts), None)
    similarity = st_config.get("similarity_fn_name") or "maxsim"
    if similarity not in ("maxsim", "meanmaxsim"):
        raise ExportError(f"{st_path}: similarity_fn_name {similarity!r} is not served (served: "
                          "maxsim, meanmaxsim)")  # fmt: skip
    settings: dict[str, Any] = {
        "query_prefix": prompts.get("query") or None, "document_prefix": document or None,
        "query_length": expansion["length"] if expansion else bert.get("query_length"),
        "document_length": bert.get("document_length"),
        "do_query_expansion": expansion is not None,
        "attend_to_expansion_tokens": bool(expansion and expansion["attend"]),
        "expansion_token": expansion["token"] if expansion else None,
        "skiplist_words": words, "score": "mean" if similarity == "meanmaxsim" else "sum",
    }  # fmt: skip
    for key in ("query_length", "document_length"):
        value = settings[key]
        if value is not None and (not isinstance(value, int) or value < 2):
            raise ExportError(f"{bert_path}: {key} must be an integer of at least 2")
    return PylateModules(dense=dense, settings=settings)


def _prompts(path: Path, found: SentenceModules) -> None:
    if not path.is_file():
        return
    config = _json(path)
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise ExportError(f"{path}: prompts must map names to strings")
    long = [k for k, v in prompts.items() if len(v) > MAX_PROMPT_CHARS]
    if long:
        raise ExportError(f"{path}: prompt {long[0]!r} is over {MAX_PROMPT_CHARS} characters")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ExportError(f"{path}: default_prompt_name {default!r} is not one of the prompts")
    found.prompts = {k: v for k, v in prompts.items()}
    found.default_prompt_name = default

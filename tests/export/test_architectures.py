"""Every architecture of the family computes what transformers computes on the same weights.

Tiny random checkpoints saved by transformers itself (``save_pretrained``: config.json +
model.safetensors, with a tokenizer.json + tokenizer_config.json of the architecture's own kind
trained by HF ``tokenizers``, and no vocab.txt) for each architecture and head (single-label,
multi-label and one-logit regression classifiers, a token classifier, the base model for
embeddings), read by export's checkpoint reader and built into export's module in-process,
against the torch model's outputs:
logits within 1e-4 (fp32), embeddings at cosine >= 0.99999, on a padded batch of sentence pairs
(token types where the architecture has them). One non-BERT checkpoint is also exported end to
end and served through the model server.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch  # the test-time numerical reference (requirements-dev.txt)
import transformers

from export.architectures import architectures
from export.gates import Tolerance
from export.tiny_tokenizers import write_tokenizer

SIZE = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 48,
        "num_hidden_layers": 2, "max_position_embeddings": 64, "vocab_size": 120,
        "initializer_range": 0.3}  # fmt: skip
# each architecture's tokenizer kind (export/tiny_tokenizers.py), as its real checkpoints have it;
# the config's vocab_size is the trained tokenizer's size, so ids and embedding rows agree
TOKENIZERS = {"bert": "wordpiece", "distilbert": "wordpiece", "electra": "wordpiece",
              "mpnet": "wordpiece", "roberta": "bpe", "modernbert": "bpe",
              "camembert": "unigram", "xlm-roberta": "unigram", "albert": "unigram-cls",
              "deberta-v3": "unigram-cls", "deberta-v2": "unigram-cls",
              "jina_embeddings_v3": "unigram", "nomic_bert": "wordpiece",
              "gte": "unigram"}  # fmt: skip

# the parity matrix's architectures: a name → transformers config keywords (tiny, and set to
# reach each architecture's differences: a short sliding window, log buckets inside the input)
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "bert": {"model_type": "bert"},
    "roberta": {"model_type": "roberta", "pad_token_id": 1, "type_vocab_size": 1},
    "xlm-roberta": {"model_type": "xlm-roberta", "pad_token_id": 1, "type_vocab_size": 1},
    "camembert": {"model_type": "camembert", "pad_token_id": 1, "type_vocab_size": 1},
    "distilbert": {"model_type": "distilbert", "dim": 32, "n_heads": 4, "n_layers": 2,
                   "hidden_dim": 48},
    "electra": {"model_type": "electra", "embedding_size": 16},
    "albert": {"model_type": "albert", "embedding_size": 16, "num_hidden_layers": 4,
               "num_hidden_groups": 2, "inner_group_num": 2},
    "mpnet": {"model_type": "mpnet", "pad_token_id": 0},
    "deberta-v3": {"model_type": "deberta-v2", "relative_attention": True,
                   "pos_att_type": ["p2c", "c2p"], "position_buckets": 8,
                   "share_att_key": True, "norm_rel_ebd": "layer_norm",
                   "position_biased_input": False, "type_vocab_size": 0},
    "deberta-v2": {"model_type": "deberta-v2", "relative_attention": True,
                   "pos_att_type": "c2p|p2c", "max_relative_positions": 16,
                   "share_att_key": False, "position_biased_input": True,
                   "type_vocab_size": 2, "embedding_size": 24},
    "modernbert": {"model_type": "modernbert", "pad_token_id": 1, "bos_token_id": 0,
                   "eos_token_id": 2, "cls_token_id": 0, "sep_token_id": 2,
                   "local_attention": 4, "global_attn_every_n_layers": 2,
                   "num_hidden_layers": 3, "classifier_pooling": "mean"},
    # XLM-R with rotary positions: no table, so the config's length is the rotary's (LONG's 2,048)
    "jina_embeddings_v3": {"model_type": "jina_embeddings_v3", "pad_token_id": 1,
                           "type_vocab_size": 1, "max_position_embeddings": 2048},
    # nomic-embed-text: BERT's token types, SwiGLU; gte-multilingual-base: XLM-R's pad and one type
    "nomic_bert": {"model_type": "nomic_bert"},
    "gte": {"model_type": "gte", "pad_token_id": 1, "type_vocab_size": 1},
}  # fmt: skip
# each row's seed is its place here: the first eleven rows sorted, later rows after them, so a
# new row changes no other row's weights (the gateway matrix and finetune save these too)
SEED_ORDER = ("albert", "bert", "camembert", "deberta-v2", "deberta-v3", "distilbert", "electra",
              "modernbert", "mpnet", "roberta", "xlm-roberta", "jina_embeddings_v3", "nomic_bert",
              "gte")  # fmt: skip
TAGS = ["O", "B-ORDER", "I-ORDER", "B-EMAIL", "I-EMAIL"]
# a head → (transformers auto class, config keywords)
HEADS: dict[str, tuple[Any, dict[str, Any]]] = {
    "single": (transformers.AutoModelForSequenceClassification,
               {"num_labels": 3, "problem_type": "single_label_classification"}),
    "multi": (transformers.AutoModelForSequenceClassification,
              {"num_labels": 3, "problem_type": "multi_label_classification"}),
    "regression": (transformers.AutoModelForSequenceClassification,
                   {"num_labels": 1, "problem_type": "regression"}),
    "tag": (transformers.AutoModelForTokenClassification,
            {"id2label": dict(enumerate(TAGS)), "label2id": {t: i for i, t in enumerate(TAGS)}}),
    "embed": (transformers.AutoModel, {}),
}  # fmt: skip
LENGTHS = (12, 7, 4)  # a padded batch: the first row fills the length


_TRAINED: dict[str, Any] = {}


def _tokenizer(arch: str, kind: str | None = None) -> Any:
    """Return the tiny trained tokenizer of ``kind`` (by default ``arch``'s own; trained once per
    kind)."""
    from export.tiny_tokenizers import build_tokenizer

    kind = kind or TOKENIZERS[arch]
    if kind not in _TRAINED:
        _TRAINED[kind] = build_tokenizer(kind)
    return _TRAINED[kind]


def _config(arch: str, head: str, kind: str | None = None,
            extra: dict[str, Any] | None = None) -> Any:  # fmt: skip
    rows = _tokenizer(arch, kind).get_vocab_size(with_added_tokens=True)
    values = {**SIZE, "vocab_size": rows, **ARCHITECTURES[arch], **(extra or {}),
              **HEADS[head][1]}  # fmt: skip
    model_type = values.pop("model_type")
    return transformers.AutoConfig.for_model(model_type, **values)


def save_checkpoint(arch: str, head: str, where: Path, kind: str | None = None,
                    extra: dict[str, Any] | None = None, name: str | None = None
                    ) -> Path:  # fmt: skip
    """Save a tiny random model of ``arch`` with ``head`` as transformers does, with a tokenizer
    of ``kind`` (by default the architecture's own, TOKENIZERS); return its dir. ``extra``:
    config keywords over the row's, saved under ``name`` (LONG's variants)."""
    cls, _ = HEADS[head]
    torch.manual_seed(SEED_ORDER.index(arch) * 10 + sorted(HEADS).index(head))
    model = cls.from_config(_config(arch, head, kind, extra)).eval()
    path = where / f"{name or arch}-{head}"
    model.save_pretrained(path)
    # what save_pretrained writes beside a fast tokenizer: tokenizer.json + its config, no vocab.txt
    write_tokenizer(path, kind or TOKENIZERS[arch], trained=_tokenizer(arch, kind))
    return path


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """Return a function saving (once per session) the checkpoint of an architecture and head."""
    where = tmp_path_factory.mktemp("architectures")
    saved: dict[tuple[str, str], Path] = {}

    def get(arch: str, head: str) -> Path:
        if (arch, head) not in saved:
            saved[arch, head] = save_checkpoint(arch, head, where)
        return saved[arch, head]

    return get


def _inputs(arch: str) -> dict[str, np.ndarray]:
    """Return a padded batch of sentence pairs: ids avoid the specials and the pad id."""
    return _batch(_config(arch, "embed"), LENGTHS)


def _batch(config: Any, lengths: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Return a padded batch of sentence pairs of ``lengths`` for a transformers ``config``."""
    pad = int(getattr(config, "pad_token_id", 0) or 0)
    rng = np.random.default_rng(11)
    seq = max(lengths)
    ids = rng.integers(5, config.vocab_size, size=(len(lengths), seq)).astype(np.int32)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    has_types = int(getattr(config, "type_vocab_size", 0) or 0) >= 2
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
        ids[row, length:] = pad
        if has_types:  # segment B: the second half of the real tokens
            types[row, length // 2 : length] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _torch(path: Path, head: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """Return transformers' logits (classifiers, tagger) or last hidden state (base model)."""
    model = HEADS[head][0].from_pretrained(str(path), local_files_only=True).eval()
    names = {"input_ids", "attention_mask"}
    if int(getattr(model.config, "type_vocab_size", 0) or 0) >= 2:
        names.add("token_type_ids")
    with torch.no_grad():
        out = model(**{k: torch.tensor(v, dtype=torch.long) for k, v in feeds.items()
                       if k in names})  # fmt: skip
    return (out.last_hidden_state if head == "embed" else out.logits).numpy()


@functools.cache
def _torch_of(path: Path, head: str, arch: str) -> np.ndarray:
    """Return ``_torch`` on ``arch``'s padded batch (``_inputs``), once per checkpoint and head
    (read-only): the embeddings' two poolings and the served RoBERTa share one reference."""
    return _frozen(_torch(path, head, _inputs(arch)))


def _ours(path: Path, head: str, feeds: dict[str, np.ndarray], pooling: str = "mean"
          ) -> dict[str, np.ndarray]:  # fmt: skip
    """Return export's serving outputs for the checkpoint at ``path`` (fp32, in-process)."""
    from export.checkpoint import read_checkpoint
    from export.heads import resolve_head
    from export.model import EncoderModule, run

    ckpt = read_checkpoint(path)
    task = {"tag": "tag", "embed": "embed"}.get(head, "classify")
    activation = resolve_head(task, ckpt.head_config, ckpt.labels).activation
    module = EncoderModule(ckpt.config, ckpt.weights, task=task, pooling=pooling,
                        activation=activation)  # fmt: skip
    return run(module.serve, feeds)


@functools.cache
def _ours_of(path: Path, head: str, arch: str, pooling: str = "mean") -> dict[str, np.ndarray]:
    """Return ``_ours`` on ``arch``'s padded batch, once per checkpoint, head and pooling
    (read-only): the fp32 single-label answers are the parity test's, the low precisions'
    reference and the early exits' full model alike (one trace, not four)."""
    return {k: _frozen(v) for k, v in _ours(path, head, _inputs(arch), pooling).items()}


def _frozen(array: np.ndarray) -> np.ndarray:
    """Return ``array`` made read-only (a cached answer no test may change)."""
    array.setflags(write=False)
    return array


def _mean(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[..., None].astype(np.float32)
    return (hidden * weights).sum(1) / weights.sum(1)


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def _scores(logits: np.ndarray, head: str) -> np.ndarray:
    if head == "single":
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    if head == "regression":
        return logits
    return 1.0 / (1.0 + np.exp(-logits))


@pytest.mark.parametrize("head", ["single", "multi", "regression", "tag"])
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_head_logits_match_transformers(
    arch: str, head: str, checkpoints: Callable[[str, str], Path]
) -> None:
    path = checkpoints(arch, head)
    feeds = _inputs(arch)
    expected = _torch_of(path, head, arch)
    got = _ours_of(path, head, arch)
    if head == "tag":  # padding positions are nobody's answer (the reader drops them)
        real = feeds["attention_mask"].astype(bool)
        np.testing.assert_allclose(got["logits"][real], expected[real], atol=1e-4)
        return
    np.testing.assert_allclose(got["logits"], expected, atol=1e-4)
    np.testing.assert_allclose(got["probabilities"], _scores(expected, head), atol=1e-5)
    assert np.abs(expected).max() > 1e-2  # the weights are spread enough to mean something


@pytest.mark.parametrize("pooling", ["mean", "cls"])
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_embeddings_match_transformers(
    arch: str, pooling: str, checkpoints: Callable[[str, str], Path]
) -> None:
    path = checkpoints(arch, "embed")
    feeds = _inputs(arch)
    hidden = _torch_of(path, "embed", arch)
    expected = _mean(hidden, feeds["attention_mask"]) if pooling == "mean" else hidden[:, 0]
    got = _ours_of(path, "embed", arch, pooling)["embedding"]
    assert _cosine(got, expected).min() >= 0.99999
    np.testing.assert_allclose(got, expected, atol=1e-4)


# rotary positions past BERT's 512 and the scaled ropes (ModernBERT's linear and yarn, as mmBERT's
# long variants say them; the one rope_parameters of NomicBERT, GTE and jina-embeddings-v3 takes
# them too): a variant → (its row, a tokenizer kind (None: the row's), config keywords over the
# row's, the batch's row lengths). Yarn's ramp is set at original_max_position_embeddings, the
# input runs past it.
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
LONG: dict[str, tuple[str, str | None, dict[str, Any], tuple[int, ...]]] = {
    "jina_embeddings_v3": ("jina_embeddings_v3", None, {}, (2048, 1027)),
    "jina_embeddings_v3-yarn": ("jina_embeddings_v3", None,
                                {"rope_parameters": {**_YARN, "rope_theta": 20_000.0}},
                                (1024, 515)),
    "modernbert-linear": ("modernbert", None, {"max_position_embeddings": 1024, "rope_parameters": {
        kind: {"rope_type": "linear", "factor": 4.0, "rope_theta": theta}
        for kind, theta in (("full_attention", 160_000.0), ("sliding_attention", 10_000.0))}},
        (1024, 515)),
    "modernbert-yarn": ("modernbert", None, {"max_position_embeddings": 1024, "rope_parameters": {
        kind: {**_YARN, "rope_theta": theta}
        for kind, theta in (("full_attention", 160_000.0), ("sliding_attention", 10_000.0))}},
        (1024, 515)),
    "nomic_bert": ("nomic_bert", None, {"max_position_embeddings": 2048}, (2048, 300)),
    "nomic_bert-linear": ("nomic_bert", None,
                          {"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                               "rope_theta": 1000.0}}, LENGTHS),
    # gte-base-en-v1.5's shape: WordPiece, no token types
    "gte-en-yarn": ("gte", "wordpiece",
                    {"type_vocab_size": 0, "pad_token_id": 0, "max_position_embeddings": 2048,
                     "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 512,
                                         "rope_theta": 160_000.0}}, (2048, 9)),
}  # fmt: skip


@pytest.mark.parametrize("variant", list(LONG))
def test_long_inputs_and_scaled_ropes_match_transformers(variant: str, tmp_path: Path) -> None:
    """The last hidden states of a padded batch of the variant's row lengths within 1e-4 of
    transformers at every real token; a scaled rope moves them (read as the default, they would
    not match)."""
    import dataclasses

    import tensorflow as tf

    from export.checkpoint import read_checkpoint
    from export.config import Rope
    from export.model import EncoderModule

    arch, kind, extra, lengths = LONG[variant]
    path = save_checkpoint(arch, "embed", tmp_path, kind, extra=extra, name=variant)
    feeds = _batch(_config(arch, "embed", kind, extra), lengths)
    expected = _torch(path, "embed", feeds)
    ckpt = read_checkpoint(path)
    real = feeds["attention_mask"].astype(bool)

    def last_hidden(encoder_config: Any) -> np.ndarray:
        module = EncoderModule(encoder_config, ckpt.weights, task="embed")
        return module.layer_outputs(
            *(tf.constant(feeds[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
        )[-1].numpy()

    np.testing.assert_allclose(last_hidden(ckpt.config)[real], expected[real], atol=1e-4)
    if ckpt.config.rope_full.rope_type != "default":
        unscaled = dataclasses.replace(
            ckpt.config,
            rope_full=Rope(ckpt.config.rope_full.theta),
            rope_sliding=Rope(ckpt.config.rope_sliding.theta),
        )
        assert np.abs(last_hidden(unscaled)[real] - expected[real]).max() > 1e-2


# the rotary architectures → each layer kind's rope_parameters key (None: one for every layer)
# and its base
ROPE_KINDS: dict[str, dict[str | None, float]] = {
    "modernbert": {"full_attention": 160_000.0, "sliding_attention": 10_000.0},
    "nomic_bert": {None: 1000.0}, "gte": {None: 160_000.0}, "jina_embeddings_v3": {None: 20_000.0},
}  # fmt: skip


@pytest.mark.parametrize("arch", list(ROPE_KINDS))
@pytest.mark.parametrize(
    "params",
    [{"rope_type": "default"}, {"rope_type": "linear", "factor": 2.5},
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
     {"rope_type": "yarn", "factor": 8.0, "beta_fast": 16, "beta_slow": 2, "truncate": False},
     {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5},
     {"rope_type": "yarn", "factor": 2.0, "attention_factor": 1.25}],
    ids=["default", "linear", "yarn", "yarn-untruncated", "yarn-mscale", "yarn-attention"],
)  # fmt: skip
def test_rope_tables_are_transformers_own(params: dict[str, Any], arch: str) -> None:
    """The inverse frequencies and cos/sin scale of every rotary architecture's every layer kind,
    read from its config.json (export/architectures/base.py's rope) and computed by
    export/layers.py's rope_frequencies, equal transformers' ROPE_INIT_FUNCTIONS'."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from export.architectures import config_from
    from export.layers import rope_frequencies

    kinds = ROPE_KINDS[arch]
    given = {kind: {**params, "rope_theta": theta} for kind, theta in kinds.items()}
    values = {**SIZE, **ARCHITECTURES[arch], "hidden_size": 64, "max_position_embeddings": 2048,
              "rope_parameters": given.get(None, given)}  # fmt: skip
    model_type = values.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **values)
    ours = config_from({**config.to_dict(), "model_type": model_type}, "config.json")
    for kind, theta in kinds.items():
        rope = ours.rope_sliding if kind == "sliding_attention" else ours.rope_full
        inv_freq, scale = rope_frequencies(rope, 16)
        if params["rope_type"] == "default":
            expected = 1.0 / theta ** (np.arange(0, 16, 2, dtype=np.float32) / 16)
            expected_scale = 1.0
        else:
            compute = ROPE_INIT_FUNCTIONS[params["rope_type"]]
            table, expected_scale = compute(config, layer_type=kind)
            expected = table.numpy()
        np.testing.assert_allclose(inv_freq, expected, rtol=1e-6, err_msg=str(kind))
        assert scale == pytest.approx(expected_scale, rel=1e-12)


@pytest.mark.parametrize(
    ("arch", "rope", "named"),
    [("modernbert", {"rope_parameters": {"full_attention": {"rope_type": "dynamic",
                                                            "factor": 2.0}}}, "dynamic"),
     ("nomic_bert", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic"),
     # gte-base-en-v1.5's own config (remote code's NTK, which transformers has no type for)
     ("gte", {"rope_scaling": {"type": "ntk", "factor": 2.0}, "rope_theta": 500_000.0}, "ntk"),
     ("jina_embeddings_v3", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}},
      "llama3")],
)  # fmt: skip
def test_other_rope_types_are_refused_naming_the_type(
    arch: str, rope: dict[str, Any], named: str, tmp_path: Path
) -> None:
    from export.checkpoint import read_checkpoint
    from export.errors import ExportError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": arch, **SIZE, **rope}))
    with pytest.raises(ExportError, match=rf"rope_type '{named}'.*default, linear, yarn"):
        read_checkpoint(tmp_path)


def test_nomic_s_own_config_keys_read_as_the_transformers_ones(
    checkpoints: Callable[[str, str], Path], tmp_path: Path
) -> None:
    """nomic-embed-text's config.json (n_embd, rotary_emb_base, activation_function "swiglu",
    ...) reads as the same encoder; what nomic's code does beyond this graph is refused by name."""
    import shutil

    from export.architectures.nomic_bert import NOMIC_KEYS
    from export.checkpoint import read_checkpoint
    from export.errors import ExportError

    saved = checkpoints("nomic_bert", "embed")
    path = tmp_path / "nomic-own-keys"
    shutil.copytree(saved, path)
    data = json.loads((saved / "config.json").read_text())
    data["rope_theta"] = data.pop("rope_parameters")["rope_theta"]
    own = {NOMIC_KEYS.get(k, k): v for k, v in data.items() if k != "hidden_act"}
    own.update(activation_function="swiglu", prenorm=False, qkv_proj_bias=False,
               rotary_emb_fraction=1.0, rotary_scaling_factor=None)  # fmt: skip
    assert "n_embd" in own and "hidden_size" not in own
    (path / "config.json").write_text(json.dumps(own))
    assert read_checkpoint(path).config == read_checkpoint(saved).config
    for change, message in (
        ({"rotary_scaling_factor": 2.0}, r"rope_type 'dynamic'"),
        ({"prenorm": True}, r"prenorm True"),
        ({"activation_function": "gelu"}, r"activation_function 'gelu'"),
    ):
        (path / "config.json").write_text(json.dumps({**own, **change}))
        with pytest.raises(ExportError, match=message):
            read_checkpoint(path)


def test_the_matrix_covers_every_registered_architecture() -> None:
    tested = {ARCHITECTURES[name]["model_type"] for name in ARCHITECTURES}
    assert tested == set(architectures())
    assert sorted(SEED_ORDER) == sorted(ARCHITECTURES)


def test_a_roberta_classifier_exports_and_serves_through_the_model_server(
    checkpoints: Callable[[str, str], Path], tmp_path: Path
) -> None:
    import requests

    from export.build import build
    from ops.stack import start_modelserver

    path = checkpoints("roberta", "single")
    result = build(path, "roberta-cls", tmp_path / "models", version=1, max_seq_len=16,
                   warmup=False)  # fmt: skip
    assert result.model_info["source"]["path"] == str(path.resolve())
    assert result.model_info["architecture"] == "roberta"
    config = tmp_path / "models.config"
    config.write_text(
        'model_config_list { config { name: "roberta-cls" '
        f'base_path: "{tmp_path / "models" / "roberta-cls"}" model_platform: "tensorflow" }} }}\n'
    )
    feeds = _inputs("roberta")
    server, _, rest = start_modelserver(config, tmp_path, batching=False)
    try:
        url = f"http://127.0.0.1:{rest}/v1/models/roberta-cls:predict"
        body = {"inputs": {k: v.tolist() for k, v in feeds.items()}}
        server.wait_until(lambda: requests.post(url, json=body, timeout=10).ok, 120)
        reply = requests.post(url, json=body, timeout=30).json()["outputs"]
    finally:
        server.stop()
    np.testing.assert_allclose(np.asarray(reply["logits"]), _torch_of(path, "single", "roberta"),
                               atol=1e-4)  # fmt: skip


def _module(path: Path, head: str, **kwargs: Any) -> Any:
    from export.checkpoint import read_checkpoint
    from export.heads import resolve_head
    from export.model import EncoderModule

    ckpt = read_checkpoint(path)
    task = {"tag": "tag", "embed": "embed"}.get(head, "classify")
    activation = resolve_head(task, ckpt.head_config, ckpt.labels).activation
    return EncoderModule(ckpt.config, kwargs.pop("weights", ckpt.weights), task=task,
                      activation=activation, **kwargs)  # fmt: skip


# the precisions every architecture is checked at beside fp32 (the build's gates, in-process)
LOW_PRECISIONS = ("bf16", "fp16")
# the gate these random weights pass (export's default max_prob_diff is 1e-2): their spread (0.3)
# is far wider than trained weights', so 16-bit rounding moves their probabilities further; the
# gateway-level matrix exports with it (`--max-prob-diff 0.05`) and holds the served answers to it
GATE_TOLERANCE = Tolerance(max_prob_diff=5e-2)


@pytest.mark.parametrize("precision", LOW_PRECISIONS)
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_low_precision_passes_the_export_gates(
    arch: str, precision: str, checkpoints: Callable[[str, str], Path]
) -> None:
    from export.gates import measure, within
    from export.model import run

    path = checkpoints(arch, "single")
    feeds = _inputs(arch)
    expected = _ours_of(path, "single", arch)  # fp32, the module's defaults
    got = run(_module(path, "single", precision=precision).serve, feeds)
    figures = measure(expected, got, attention_mask=feeds["attention_mask"])
    assert within(figures, GATE_TOLERANCE), figures
    assert figures["decisive_agreement"] == 1.0


# architectures whose early-exit graph is checked here (students after every layer but the last)
EARLY_EXIT = tuple(ARCHITECTURES)


@pytest.mark.parametrize("arch", EARLY_EXIT)
def test_early_exits_hook_the_layer_loop_of_every_architecture(
    arch: str, checkpoints: Callable[[str, str], Path]
) -> None:
    """Speed 0 is exactly the full model; at speed 1 rows leave early, compacted or not alike."""
    from export.checkpoint import read_checkpoint
    from export.model import run

    path = checkpoints(arch, "single")
    ckpt = read_checkpoint(path)
    steps, hidden = len(ckpt.config.plan), ckpt.config.hidden_size
    rng = np.random.default_rng(3)
    students = {
        f"exit_{k}/{part}/{kind}": rng.normal(0, 0.5, shape).astype(np.float32)
        for k in range(steps - 1)
        for part, kind, shape in (("dense", "kernel", (hidden, 8)), ("dense", "bias", (8,)),
                                  ("classifier", "kernel", (8, 3)),
                                  ("classifier", "bias", (3,)))
    }  # fmt: skip
    weights = {**ckpt.weights, **students}
    exits = {"pooling": "mean"}
    feeds = _inputs(arch)
    full = _ours_of(path, "single", arch)["logits"]  # fp32, the module's defaults
    compacted = _module(path, "single", weights=weights, early_exit=exits)
    masked = _module(path, "single", weights=weights, early_exit=exits, compaction=False)
    at_zero = run(compacted.serve, {**feeds, "speed": np.zeros(len(LENGTHS), np.float32)})
    np.testing.assert_allclose(at_zero["logits"], full, atol=1e-5)
    assert list(at_zero["exit_layer"]) == [steps] * len(LENGTHS)
    fast = {**feeds, "speed": np.ones(len(LENGTHS), np.float32)}
    one, other = run(compacted.serve, fast), run(masked.serve, fast)
    assert (one["exit_layer"] < steps).any()
    np.testing.assert_array_equal(one["exit_layer"], other["exit_layer"])
    np.testing.assert_allclose(one["logits"], other["logits"], atol=1e-5)


# each check of the parity matrices, as docs/reference/supported-models.md names it, in its order
CHECKS = {
    "single": "classify: single-label", "pair": "classify: sentence pairs",
    "multi": "classify: multi-label", "regression": "classify: regression (one logit)",
    "cross": "classify: one-logit cross-encoder", "tag": "tag", "embed": "embed",
    "tokenize": "tokenize", "bf16": "bf16", "fp16": "fp16", "early exit": "early exit",
}  # fmt: skip
CLASSIFY_WORDS = {"single": "single-label", "pair": "pairs", "multi": "multi-label",
                  "regression": "regression", "cross": "cross-encoder"}  # fmt: skip
# what the tests in this file check for every architecture of ARCHITECTURES
IN_PROCESS = (*HEADS, *LOW_PRECISIONS, *(("early exit",) if EARLY_EXIT else ()))


def _gateway_matrix() -> tuple[set[str], set[str]]:
    """Return what tests/backend/test_architectures_e2e.py checks through the model server and
    gateway, and the model_types it checks it for."""
    from tests.backend import test_architectures_e2e as e2e

    return set(e2e.CHECKED), {ARCHITECTURES[name]["model_type"] for name in e2e.GATEWAY}


def _expected_rows() -> tuple[list[list[str]], list[list[str]]]:
    """Return the supported-models tables' rows as the registry and the two matrices make them:
    one per architecture, one per check (which matrix runs it)."""
    gateway, through = _gateway_matrix()
    checked = set(IN_PROCESS) | gateway
    tested = {spec["model_type"] for spec in ARCHITECTURES.values()}
    exits = {ARCHITECTURES[name]["model_type"] for name in EARLY_EXIT}
    classify = ", ".join(w for h, w in CLASSIFY_WORDS.items() if h in checked)
    heads = ", ".join([f"classify ({classify})", *(h for h in ("tag", "embed") if h in checked)])
    precision = ", ".join(("fp32", *(p for p in LOW_PRECISIONS if p in checked)))
    architecture_rows = [
        [arch.title, f"`{model_type}`", heads, "yes" if model_type in exits else "no",
         precision if model_type in tested | through else "fp32",
         "yes" if model_type in tested else "no", "yes" if model_type in through else "no"]
        for model_type, arch in architectures().items()
    ]  # fmt: skip
    check_rows = [[words, "yes" if key in IN_PROCESS else "no", "yes" if key in gateway else "no"]
                  for key, words in CHECKS.items() if key in checked]  # fmt: skip
    assert checked <= set(CHECKS), checked - set(CHECKS)  # every check has its words
    return architecture_rows, check_rows


def _table(text: str, header: str) -> list[list[str]]:
    """Return the cells of the markdown table whose header row starts with ``header``."""
    lines = text.split(header, 1)[1].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_supported_models_table_claims_only_what_these_tests_run() -> None:
    from ops.procs import REPO

    text = (REPO / "docs" / "reference" / "supported-models.md").read_text(encoding="utf-8")
    for header, expected in zip(("| Architecture | model_type |", "| Check |"), _expected_rows(),
                                strict=True):  # fmt: skip
        rendered = "\n".join("| " + " | ".join(row) + " |" for row in expected)
        where = f"docs/reference/supported-models.md's table under {header!r}"
        assert _table(text, header) == expected, f"{where} should read:\n{rendered}"


def test_a_torch_pickle_only_checkpoint_is_refused_with_what_to_do(tmp_path: Path) -> None:
    from export.checkpoint import read_checkpoint
    from export.errors import ExportError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "roberta", **SIZE}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ExportError, match=r"torch pickle.*safetensors"):
        read_checkpoint(tmp_path)


def test_a_slow_tokenizer_only_checkpoint_is_told_how_to_make_tokenizer_json(
    checkpoints: Callable[[str, str], Path], tmp_path: Path
) -> None:
    """RoBERTa saved with its slow tokenizer (vocab.json + merges.txt, no tokenizer.json): the
    error points to the guide's section on making tokenizer.json, and its command, run on this
    directory, makes it readable."""
    import shutil
    import subprocess
    import sys

    from tokenizers import Tokenizer

    from export.checkpoint import read_checkpoint
    from export.errors import ExportError
    from export.tokenizer_assets import SLOW_TOKENIZER_GUIDE
    from ops.procs import REPO

    path = tmp_path / "slow"
    shutil.copytree(checkpoints("roberta", "single"), path)
    fast = Tokenizer.from_file(str(path / "tokenizer.json"))
    fast.model.save(str(path))  # vocab.json + merges.txt, the slow RobertaTokenizer's files
    (path / "tokenizer.json").unlink()
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "RobertaTokenizer"  # as a slow tokenizer's save names itself
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(
        ExportError, match=r"vocab\.json, merges\.txt.*no tokenizer\.json"
    ) as caught:
        read_checkpoint(path)
    assert SLOW_TOKENIZER_GUIDE in str(caught.value)
    guide = (REPO / "docs" / "guides" / "serve-your-own-model.md").read_text(encoding="utf-8")
    section = guide.split("### A checkpoint without tokenizer.json", 1)[1]
    command = section.split("python -c ", 1)[1].split("\n", 1)[0]
    command = json.loads(command).replace("my-checkpoint", str(path))
    subprocess.run([sys.executable, "-c", command], check=True, timeout=120)
    assert read_checkpoint(path).tokenizer is not None
    assert (path / "tokenizer.json").is_file()


def test_an_unknown_model_type_names_every_supported_one(tmp_path: Path) -> None:
    from export.checkpoint import read_checkpoint
    from export.errors import ExportError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", **SIZE}))
    with pytest.raises(ExportError) as caught:
        read_checkpoint(tmp_path)
    assert "model_type='gpt2'" in str(caught.value)
    assert all(model_type in str(caught.value) for model_type in architectures())


def test_export_reads_and_builds_every_architecture_without_torch(
    checkpoints: Callable[[str, str], Path],
) -> None:
    import subprocess
    import sys

    from ops.procs import REPO, child_env

    paths = [str(checkpoints(arch, "single")) for arch in ARCHITECTURES]
    code = (  # TensorFlow imported as ``python -m export`` imports it (export/lean_tf.py)
        "import sys\n"
        "from export.lean_tf import import_tensorflow\n"
        "import_tensorflow()\n"
        "from export.checkpoint import read_checkpoint\n"
        "from export.model import EncoderModule\n"
        "for path in sys.argv[1:]:\n"
        "    ckpt = read_checkpoint(path)\n"
        "    EncoderModule(ckpt.config, ckpt.weights, task='classify')\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code, *paths], cwd=REPO, env=child_env(),
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]

"""Tiny random retrieval checkpoints of each layout (export/retrieval.py), for tests and e2e.

Each is saved the way its own library saves it, so the parity tests compare against the real
thing and the gateway's end-to-end tests can build the same files:

- ``save_m3_checkpoint``: FlagEmbedding's BGE-M3 layout: a tiny encoder saved by transformers
  (``save_pretrained``), a trained tokenizer of the architecture's kind
  (export/tiny_tokenizers.py), and ``sparse_linear.pt`` / ``colbert_linear.pt`` saved by
  ``torch.save(nn.Linear(...).state_dict())`` as FlagEmbedding's training saves them.
- ``save_pylate_checkpoint``: a PyLate ``ColBERT`` built on such an encoder and saved by PyLate
  itself (``ColBERT(...).save``: modules.json, ``1_Dense``, config_sentence_transformers.json,
  the tokenizer with its ``[Q] ``/``[D] `` prefixes added).
- ``save_multivector_checkpoint``: sentence-transformers 6's ``MultiVectorEncoder`` (PyLate's
  ColBERT, absorbed) on such an encoder, saved by sentence-transformers itself (needs 6.x);
  ``as_multivector_layout`` writes a PyLate directory over again the way 6.x saves that model
  (no sentence-transformers needed: the 6.x layout read where 5.x is installed).
- ``save_stanford_checkpoint``: Stanford ColBERTv2's ``HF_ColBERT`` layout: config.json's
  ``architectures: ["HF_ColBERT"]``, the encoder under ``bert.`` and ``linear.weight`` in one
  model.safetensors, ``artifact.metadata``, a WordPiece tokenizer with ``[unused0]``/``[unused1]``.

``ARCHITECTURES`` lists the encoders (tiny configs: 2 layers, hidden 32). torch, transformers and
PyLate are imported when a function is called (test-time packages, requirements-dev.txt); nothing
here is imported by the product.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HIDDEN = 32
SIZE: dict[str, Any] = {"hidden_size": HIDDEN, "num_attention_heads": 4, "intermediate_size": 48,
                        "num_hidden_layers": 2, "max_position_embeddings": 160,
                        "initializer_range": 0.3}  # fmt: skip
# an architecture -> (tokenizer kind, transformers config keywords), as tests/export/
# test_architectures.py builds them
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "bert": ("wordpiece", {"model_type": "bert"}),
    "roberta": ("bpe", {"model_type": "roberta", "pad_token_id": 1, "type_vocab_size": 1}),
    "xlm-roberta": ("unigram", {"model_type": "xlm-roberta", "pad_token_id": 1,
                                "type_vocab_size": 1}),
    "distilbert": ("wordpiece", {"model_type": "distilbert", "dim": 32, "n_heads": 4,
                                 "n_layers": 2, "hidden_dim": 48}),
    "electra": ("wordpiece", {"model_type": "electra", "embedding_size": 16}),
    "albert": ("unigram-cls", {"model_type": "albert", "embedding_size": 16,
                               "num_hidden_groups": 1, "inner_group_num": 1}),
    "mpnet": ("wordpiece", {"model_type": "mpnet", "pad_token_id": 0}),
    "deberta-v2": ("unigram-cls", {"model_type": "deberta-v2", "relative_attention": True,
                                   "pos_att_type": ["p2c", "c2p"], "position_buckets": 8,
                                   "share_att_key": True, "norm_rel_ebd": "layer_norm",
                                   "position_biased_input": False, "type_vocab_size": 0}),
    "modernbert": ("bpe", {"model_type": "modernbert", "pad_token_id": 1, "bos_token_id": 0,
                           "eos_token_id": 2, "cls_token_id": 0, "sep_token_id": 2,
                           "local_attention": 4, "global_attn_every_n_layers": 2}),
}  # fmt: skip
STANFORD_TOKENS = ("[unused0]", "[unused1]")
SAMPLE = ["where is my order? it is three days late.", "refund, please!",
          "the quick brown fox jumps over the lazy dog", "my card was charged twice"]  # fmt: skip


def _trained(kind: str, extra: tuple[str, ...] = ()) -> Any:
    from tokenizers import AddedToken

    from export.tiny_tokenizers import build_tokenizer

    tok = build_tokenizer(kind)
    if extra:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra])  # type: ignore[attr-defined]
    return tok


def save_encoder(dest: str | Path, arch: str = "bert", *, seed: int = 0,
                 extra_tokens: tuple[str, ...] = (),
                 size: dict[str, Any] | None = None) -> Path:  # fmt: skip
    """Save a tiny random ``arch`` base model (transformers' ``AutoModel``) with its tokenizer
    into ``dest`` and return it; ``extra_tokens`` are added to the tokenizer (and the vocab);
    ``size`` replaces SIZE's config keywords (a benchmark's MiniLM-sized encoder)."""
    return _save_encoder(dest, arch, seed=seed, extra_tokens=extra_tokens, size=size)[0]


def _save_encoder(dest: str | Path, arch: str, *, seed: int, extra_tokens: tuple[str, ...] = (),
                  size: dict[str, Any] | None = None) -> tuple[Path, Any]:  # fmt: skip
    """Return ``save_encoder``'s directory and the model it saved there (in memory: a caller
    that computes with it reads nothing back)."""
    import torch
    import transformers

    from export.tiny_tokenizers import write_tokenizer

    kind, keywords = ARCHITECTURES[arch]
    tok = _trained(kind, extra_tokens)
    values = {
        **(size or SIZE),
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        **keywords,
    }
    model_type = values.pop("model_type")
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(model_type, **values)
    model = transformers.AutoModel.from_config(config).eval()
    dest = Path(dest)
    model.save_pretrained(dest)
    write_tokenizer(dest, kind, trained=tok)
    return dest, model


def save_m3_checkpoint(dest: str | Path, arch: str = "xlm-roberta", *, colbert_dim: int = 16,
                       seed: int = 0, head_dtype: str = "float32",
                       size: dict[str, Any] | None = None) -> Path:  # fmt: skip
    """Save FlagEmbedding's BGE-M3 layout of a tiny ``arch`` encoder into ``dest``: the encoder,
    ``sparse_linear.pt`` (``nn.Linear(hidden, 1)``) and ``colbert_linear.pt``
    (``nn.Linear(hidden, colbert_dim)``), the heads' tensors in ``head_dtype`` (float32,
    float16 as BAAI/bge-m3 ships its sparse head, or bfloat16); return ``dest``.

    FlagEmbedding loads it with ``BGEM3FlagModel(dest, colbert_dim=colbert_dim)``. ``size``:
    the encoder's config keywords in place of SIZE's (as ``save_encoder``).
    """
    import tokenizers
    import torch

    dest, model = _save_encoder(dest, arch, seed=seed, size=size)
    hidden = int((size or SIZE)["hidden_size"])
    torch.manual_seed(seed + 1)
    dtype = getattr(torch, head_dtype)
    sparse, colbert = torch.nn.Linear(hidden, 1), torch.nn.Linear(hidden, colbert_dim)
    # a random encoder's tokens share most of their hidden state: the sparse head is made blind
    # to the shared part (else its weights are differences of large numbers, which no 16-bit
    # graph keeps), then scaled and shifted on a few texts so that about half of the tokens
    # weigh > 0, with O(1) weights
    # the saved tokenizer.json's ids (special tokens included), right-padded with the model's
    # pad id, as transformers' tokenizer of that directory pads them
    rows = [e.ids for e in tokenizers.Tokenizer.from_file(str(dest / "tokenizer.json"))
            .encode_batch(SAMPLE)]  # fmt: skip
    longest, pad = max(map(len, rows)), int(model.config.pad_token_id or 0)
    ids = torch.tensor([r + [pad] * (longest - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in rows])
    with torch.no_grad():
        states = model(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        mean = states.mean(0)  # what every token shares: no weight on it (well-conditioned)
        sparse.weight[0] -= (sparse.weight[0] @ mean) / (mean @ mean) * mean
        raw = (states @ sparse.weight[0]).sort().values
        middle = float(raw[len(raw) // 2 - 1] + raw[len(raw) // 2]) / 2  # no token at 0
        sparse.weight.mul_(1.0 / float(raw.std()))
        sparse.bias.fill_(-middle / float(raw.std()))
    for name, linear in (("sparse_linear.pt", sparse), ("colbert_linear.pt", colbert)):
        torch.save({k: v.to(dtype) for k, v in linear.state_dict().items()}, dest / name)
    return dest


def save_pylate_checkpoint(dest: str | Path, arch: str = "bert", *, embedding_size: int = 16,
                           seed: int = 0, query_length: int = 16, document_length: int = 32,
                           attend_to_expansion_tokens: bool = False) -> Path:  # fmt: skip
    """Save a PyLate ``ColBERT`` on a tiny ``arch`` encoder into ``dest``, by PyLate itself
    (its Dense ``hidden -> embedding_size``, ``[Q] ``/``[D] `` prefixes, string.punctuation
    skiplist); return ``dest``. Needs PyLate (requirements-dev.txt)."""
    import torch
    from pylate import models

    dest = Path(dest)
    base = save_encoder(dest.with_name(dest.name + "-base"), arch, seed=seed)
    torch.manual_seed(seed + 1)
    model = models.ColBERT(
        model_name_or_path=str(base), embedding_size=embedding_size, query_length=query_length,
        document_length=document_length, attend_to_expansion_tokens=attend_to_expansion_tokens,
        device="cpu",
    )  # fmt: skip
    model.save(str(dest))
    return dest


MARKERS = ("[Q] ", "[D] ")  # PyLate's prefixes, added to the tokenizer as PyLate adds them


def save_multivector_checkpoint(dest: str | Path, arch: str = "bert", *,
                                embedding_size: int = 16, seed: int = 0, query_length: int = 16,
                                document_length: int = 32, attend: bool = False,
                                similarity: str = "maxsim") -> Path:  # fmt: skip
    """Save a sentence-transformers 6 ``MultiVectorEncoder`` on a tiny ``arch`` encoder into
    ``dest`` by sentence-transformers itself and return it: the Transformer (queries expanded to
    ``query_length``, documents cut to ``document_length``), a Dense ``hidden ->
    embedding_size``, a MultiVectorMask skipping string.punctuation in documents, Normalize, and
    ``[Q] ``/``[D] `` prompts that are tokens of its tokenizer (PyLate's markers)."""
    import string

    import torch
    from sentence_transformers import MultiVectorEncoder  # type: ignore[attr-defined]  # 6.x
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    dest = Path(dest)
    base = save_encoder(dest.with_name(dest.name + "-base"), arch, seed=seed, extra_tokens=MARKERS)
    transformer = Transformer(
        str(base), document_length=document_length,
        query_expansion={"strategy": "fixed", "attend": attend, "length": query_length},
    )  # fmt: skip
    torch.manual_seed(seed + 1)
    dense = Dense(HIDDEN, embedding_size, bias=False, activation_function=torch.nn.Identity(),
                  module_input_name="token_embeddings")  # fmt: skip
    model = MultiVectorEncoder(
        modules=[transformer, dense, MultiVectorMask(skiplist_words=list(string.punctuation)),
                 Normalize(module_input_name="token_embeddings")],
        prompts=dict(zip(("query", "document"), MARKERS, strict=True)), device="cpu",
        similarity_fn_name=similarity,
    )  # fmt: skip
    model.save(str(dest))
    return dest


def as_multivector_layout(source: str | Path, dest: str | Path) -> Path:
    """Write the PyLate ColBERT directory ``source`` into ``dest`` as sentence-transformers 6
    saves that model (modules.json's class paths, the Dense's ``module_input_name``, the
    MultiVectorMask and Normalize modules, the Transformer's lengths and expansion in
    sentence_bert_config.json, the prefixes as prompts) and return ``dest``."""
    import shutil

    source, dest = Path(source), Path(dest)
    shutil.copytree(source, dest)
    st = json.loads((source / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    dense = json.loads((source / "1_Dense" / "config.json").read_text(encoding="utf-8"))
    dense.pop("use_residual", None)
    dense.update(module_input_name="token_embeddings", module_output_name="token_embeddings")
    folders = {"2_MultiVectorMask": {"skiplist_words": st["skiplist_words"],
                                     "skiplist_tasks": ["document"], "keep_only_token_ids": None},
               "3_Normalize": {"module_input_name": "token_embeddings",
                               "module_output_name": "token_embeddings"},
               "1_Dense": dense}  # fmt: skip
    for folder, config in folders.items():
        (dest / folder).mkdir(exist_ok=True)
        (dest / folder / "config.json").write_text(json.dumps(config, indent=4), "utf-8")
    mask = "multi_vector_encoder.modules.multi_vector_mask"
    paths = {"Transformer": ("", "base.modules.transformer"),
             "Dense": ("1_Dense", "base.modules.dense"),
             "MultiVectorMask": ("2_MultiVectorMask", mask),
             "Normalize": ("3_Normalize", "base.modules.normalize")}  # fmt: skip
    modules = [{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.{m}.{kind}"}
               for i, (kind, (path, m)) in enumerate(paths.items())]  # fmt: skip
    (dest / "modules.json").write_text(json.dumps(modules, indent=2), "utf-8")
    expansion = {"strategy": "fixed", "attend": st["attend_to_expansion_tokens"], "token": None,
                 "length": st["query_length"]} if st["do_query_expansion"] else None  # fmt: skip
    bert = {"transformer_task": "feature-extraction",
            "modality_config": {"text": {"method": "forward",
                                         "method_output_name": "last_hidden_state"}},
            "module_output_name": "token_embeddings", "document_length": st["document_length"],
            "query_expansion": expansion}  # fmt: skip
    (dest / "sentence_bert_config.json").write_text(json.dumps(bert, indent=4), "utf-8")
    config = {"__version__": {"sentence_transformers": "6.2.0"}, "default_prompt_name": None,
              "model_type": "MultiVectorEncoder", "similarity_fn_name": None,
              "prompts": {"query": st["query_prefix"],
                          "document": st["document_prefix"]}}  # fmt: skip
    (dest / "config_sentence_transformers.json").write_text(json.dumps(config, indent=2), "utf-8")
    return dest


def save_stanford_checkpoint(dest: str | Path, arch: str = "bert", *, dim: int = 16,
                             seed: int = 0, query_maxlen: int = 16,
                             doc_maxlen: int = 32) -> Path:  # fmt: skip
    """Save Stanford ColBERTv2's ``HF_ColBERT`` layout of a tiny WordPiece ``arch`` encoder
    (bert or electra) into ``dest`` and return it: ``linear.weight`` [dim, hidden] beside the
    encoder's tensors (under its base prefix) in model.safetensors, ``artifact.metadata``."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    dest = save_encoder(dest, arch, seed=seed, extra_tokens=STANFORD_TOKENS)
    weights = load_file(str(dest / "model.safetensors"))
    prefix = {"bert": "bert.", "electra": "electra."}[arch]
    rng = np.random.default_rng(seed + 1)
    tensors = {prefix + k: v for k, v in weights.items()}
    tensors["linear.weight"] = rng.normal(0, 0.3, (dim, HIDDEN)).astype(np.float32)
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((dest / "config.json").read_text(encoding="utf-8"))
    config["architectures"] = ["HF_ColBERT"]
    (dest / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    metadata = {"query_token_id": STANFORD_TOKENS[0], "doc_token_id": STANFORD_TOKENS[1],
                "query_maxlen": query_maxlen, "doc_maxlen": doc_maxlen, "dim": dim,
                "mask_punctuation": True, "attend_to_mask_tokens": False,
                "similarity": "cosine"}  # fmt: skip
    (dest / "artifact.metadata").write_text(json.dumps(metadata, indent=2), encoding="utf-8")
    return dest

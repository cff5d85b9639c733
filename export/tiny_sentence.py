"""Tiny sentence-transformers checkpoints for tests: a tiny random BERT (export/tiny.py) with
``modules.json``, ``1_Pooling``, optional ``2_Dense`` and ``Normalize`` and
``config_sentence_transformers.json``, as sentence-transformers saves them (no TF, no torch):
5.x's layout, or 6.x's (``layout="6"``: the modules' new class paths, Pooling's ``pooling_mode``
names in their order, Dense's and Normalize's feature names)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from export.sentence_modules import POOLING_KEYS

# the class paths each layout's modules.json names
MODULE_TYPES = {
    "5": {kind: f"sentence_transformers.models.{kind}"
          for kind in ("Transformer", "Pooling", "Dense", "Normalize")},
    "6": {"Transformer": "sentence_transformers.base.modules.transformer.Transformer",
          "Pooling": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
          "Dense": "sentence_transformers.base.modules.dense.Dense",
          "Normalize": "sentence_transformers.base.modules.normalize.Normalize"},
}  # fmt: skip
# the graph's pooling names -> 6.x's pooling_mode names
ST6_POOLINGS = {"mean_sqrt_len": "mean_sqrt_len_tokens"}
TORCH_ACTIVATIONS = {"tanh": "torch.nn.modules.activation.Tanh",
                     "identity": "torch.nn.modules.linear.Identity",
                     "relu": "torch.nn.modules.activation.ReLU"}  # fmt: skip


def write_sentence_checkpoint(
    dest: str | Path,
    *,
    pooling: Sequence[str] = ("mean",),
    dense: Sequence[tuple[int, str]] = (),
    normalize: bool = True,
    prompts: Mapping[str, str] | None = None,
    default_prompt_name: str | None = None,
    include_prompt: bool = True,
    seed: int = 0,
    hidden: int = 32,
    tokenizer_kind: str | None = None,
    layout: str = "5",
) -> Path:
    """Write a sentence-transformers directory and return it; ``dense`` lists (out, activation)
    Dense modules after the pooling. ``tokenizer_kind`` (export/tiny_tokenizers.py) gives it
    that tokenizer's files instead of BERT's vocab.txt (the word embedding sized to it);
    ``layout`` is the sentence-transformers major version whose files it writes ("5" or "6":
    6.x concatenates the poolings in the order given, 5.x in its own)."""
    from safetensors.numpy import save_file

    from export.tiny import write_hf_checkpoint

    vocab: list[str] | None = None
    trained: Any = None
    if tokenizer_kind is not None:
        from export.tiny_tokenizers import build_tokenizer

        trained = build_tokenizer(tokenizer_kind)
        vocab = [f"t{i}" for i in range(trained.get_vocab_size(with_added_tokens=True))]
    dest = write_hf_checkpoint(dest, task="embed", seed=seed, hidden=hidden, vocab=vocab)
    if tokenizer_kind is not None:
        from export.tiny_tokenizers import write_tokenizer

        (dest / "vocab.txt").unlink()
        (dest / "tokenizer_config.json").unlink()
        write_tokenizer(dest, tokenizer_kind, trained=trained)
    types = MODULE_TYPES[layout]
    modules = [{"idx": 0, "name": "0", "path": "", "type": types["Transformer"]}]
    (dest / "1_Pooling").mkdir(exist_ok=True)
    config: dict[str, object] = {"word_embedding_dimension": hidden,
                                 "include_prompt": include_prompt}  # fmt: skip
    if layout == "6":
        names = [ST6_POOLINGS.get(p, p) for p in pooling]
        config = {"embedding_dimension": hidden, "include_prompt": include_prompt,
                  "pooling_mode": names[0] if len(names) == 1 else names}  # fmt: skip
    else:
        config.update({key: name in pooling for name, key in POOLING_KEYS})
    (dest / "1_Pooling" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": types["Pooling"]})
    features = {"module_input_name": "sentence_embedding",
                "module_output_name": "sentence_embedding"} if layout == "6" else {}  # fmt: skip
    rng = np.random.default_rng(seed + 100)
    width = hidden * len(pooling)
    for out, activation in dense:
        path = f"{len(modules)}_Dense"
        (dest / path).mkdir(exist_ok=True)
        (dest / path / "config.json").write_text(json.dumps({
            "in_features": width, "out_features": out, "bias": True,
            "activation_function": TORCH_ACTIVATIONS[activation], **features,
        }), encoding="utf-8")  # fmt: skip
        save_file({
            "linear.weight": rng.normal(0, 0.3, (out, width)).astype(np.float32),
            "linear.bias": rng.normal(0, 0.1, (out,)).astype(np.float32),
        }, str(dest / path / "model.safetensors"))  # fmt: skip
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": path,
                        "type": types["Dense"]})  # fmt: skip
        width = out
    if normalize:
        path = f"{len(modules)}_Normalize"
        if layout == "6":  # 6.x writes the feature names it normalizes
            (dest / path).mkdir(exist_ok=True)
            (dest / path / "config.json").write_text(json.dumps(features), encoding="utf-8")
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": path,
                        "type": types["Normalize"]})  # fmt: skip
    (dest / "modules.json").write_text(json.dumps(modules, indent=2), encoding="utf-8")
    st_config = {"prompts": dict(prompts or {}), "default_prompt_name": default_prompt_name,
                 "similarity_fn_name": "cosine"}  # fmt: skip
    bert: dict[str, object] = {"max_seq_length": 64, "do_lower_case": False}
    if layout == "6":
        st_config.update(model_type="SentenceTransformer",
                         __version__={"sentence_transformers": "6.2.0"})  # fmt: skip
        bert = {"transformer_task": "feature-extraction",
                "modality_config": {"text": {"method": "forward",
                                             "method_output_name": "last_hidden_state"}},
                "module_output_name": "token_embeddings"}  # fmt: skip
    (dest / "config_sentence_transformers.json").write_text(json.dumps(st_config), "utf-8")
    (dest / "sentence_bert_config.json").write_text(json.dumps(bert), encoding="utf-8")
    return dest

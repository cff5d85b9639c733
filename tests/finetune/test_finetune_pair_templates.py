"""Sentence pairs are trained in the checkpoint's own pair template, as they are served.

``finetune --task pair-classify`` builds each training pair from the checkpoint's tokenizer.json
(its ``TemplateProcessing`` / ``RobertaProcessing``), as the gateway does: ``[CLS] a [SEP] b
[SEP]`` with token type 1 on ``b [SEP]`` for BERT's WordPiece and DeBERTa-v3's Unigram, ``<s> a
</s></s> b </s>`` with every type 0 for RoBERTa's byte-level BPE and XLM-R's Unigram. Checked
against transformers' fast tokenizer, ``tokenizer(a, b, truncation=True, max_length=...)``, from
the same directory (long pairs cut longest-first, a first segment that alone fills the length
included); then a cross-encoder fine-tuned from the tiny RoBERTa is read back by transformers to
export's logits on the pairs transformers builds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from finetune.tasks import PairTask, TaskOptions
from tests.finetune.test_finetune_heads import ONE_EPOCH, pair_rows, write_pairs

ARCHS = ["bert", "roberta", "xlm-roberta", "deberta-v3"]
MAX = 24
PAIRS = [
    ("where is my order", "track the package delivery here"),
    ("café 我的订单 🙂", "ok"),
    ("where is my order", "track the package delivery here " * 8),  # long second segment
    ("refund my card please " * 8, "the card was charged twice"),  # first alone fills MAX
    ("refund my card please " * 5, "the card was charged twice " * 5),  # both long
]


@pytest.mark.parametrize("arch", ARCHS)
def test_training_pairs_are_the_pairs_transformers_builds(
    arch: str, base_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from export.checkpoint import read_checkpoint
    from finetune.data import read_pairs
    from finetune.pipeline import UNCUT, checkpoint_tokenizer

    path = base_checkpoint(arch)
    rows = [(a, b, "relevant" if i % 2 else "irrelevant") for i, (a, b) in enumerate(PAIRS)]
    examples = read_pairs(write_pairs(tmp_path / "pairs.tsv", rows))
    task = PairTask(TaskOptions("pair-classify"))
    task.labels = task.label_set(examples)
    ckpt = read_checkpoint(path)
    split = task.encode(checkpoint_tokenizer(ckpt, MAX), checkpoint_tokenizer(ckpt, UNCUT),
                        examples, "optimised")  # fmt: skip

    theirs = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    for (a, b), ids, types in zip(PAIRS, split.ids, split.types, strict=True):
        want = theirs(a, b, truncation=True, max_length=MAX, return_token_type_ids=True)
        assert ids.tolist() == want["input_ids"], (arch, theirs.convert_ids_to_tokens(ids))
        assert types.tolist() == want["token_type_ids"], arch
    assert max(len(ids) for ids in split.ids) == MAX  # the long pairs were cut, not refused


def test_a_cross_encoder_fine_tuned_from_roberta_loads_in_transformers_alike(
    base_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    import torch
    import transformers

    from export.checkpoint import read_checkpoint
    from export.model import EncoderModule
    from finetune.run import finetune
    from finetune.training import TrainConfig

    train = write_pairs(tmp_path / "train.tsv", pair_rows(1) * 2)
    dev = write_pairs(tmp_path / "dev.tsv", pair_rows(2))
    result = finetune(base_checkpoint("roberta"), train, dev, tmp_path / "out", test_path=dev,
                      config=TrainConfig(**ONE_EPOCH), precision="fp32", max_seq_len=32,
                      task=TaskOptions("pair-classify", num_labels=1))  # fmt: skip

    load = transformers.AutoModelForSequenceClassification.from_pretrained
    model, info = load(str(result.out), local_files_only=True, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(result.out), local_files_only=True)
    a, b = zip(*PAIRS[:3], strict=True)
    batch = tokenizer(list(a), list(b), padding=True, truncation=True, max_length=32,
                      return_tensors="np")  # fmt: skip
    with torch.no_grad():
        theirs = model.eval()(
            input_ids=torch.from_numpy(batch["input_ids"]),
            attention_mask=torch.from_numpy(batch["attention_mask"]),
        ).logits.numpy()
    ckpt = read_checkpoint(result.out)
    ours = (
        EncoderModule(ckpt.config, ckpt.weights, task="classify")
        .logits(
            batch["input_ids"].astype(np.int32),
            batch["attention_mask"].astype(np.int32),
            np.zeros_like(batch["input_ids"], np.int32),
        )
        .numpy()
    )
    assert theirs.shape == (3, 1)
    np.testing.assert_allclose(ours, theirs, atol=1e-4)

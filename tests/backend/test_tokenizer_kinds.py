"""Every tokenizer kind, as export writes it and the gateway loads it, against transformers.

Tokenizers of each kind are trained here with HF ``tokenizers`` (export/tiny_tokenizers.py),
saved as ``save_pretrained`` saves them, read by export's tokenizer reader into a version's
assets, loaded by the gateway's loader; transformers' ``AutoTokenizer`` reads the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from backend.tagging import tag_text
from backend.tokenization import FirstSegmentTooLong, TextTokenizer
from export.tiny_tokenizers import KINDS, write_tokenizer
from export.tokenizer_assets import read_tokenizer
from modelformat.tokenizer import load_tokenizer
from tests.backend.corpus import CORPUS

MAX_LEN = 24
TEXTS = [t for t in CORPUS if t.strip()][:24]
PAIRS = [
    ("hello world", "my card was charged twice"),
    ("where is my order? it is late", "refunds"),
    ("my card was charged twice", "the refund " * 6),
    ("a", "the quick brown fox jumps over the lazy dog " * 3),
    ("Café naïve", "résumé façade Ångström straße"),
]


def _version(tmp: Path, checkpoint: Path, rows: int = 10_000) -> Path:
    """Write what export writes for ``checkpoint``'s tokenizer into a version dir."""
    assets = read_tokenizer(checkpoint, rows=rows)
    version = tmp / "1"
    assets.write(version)
    info = {"max_seq_len": MAX_LEN, "tokenizer": assets.entry}
    (version / "assets" / "model.json").write_text(json.dumps(info), encoding="utf-8")
    return version


def _ours(version: Path, max_len: int = MAX_LEN) -> TextTokenizer:
    info = json.loads((version / "assets" / "model.json").read_text(encoding="utf-8"))
    tokenizer, spec = load_tokenizer(version, info)
    return TextTokenizer(tokenizer, max_seq_len=max_len, pad_id=spec.pad_id, unk_id=spec.unk_id,
                         truncation_side=spec.truncation_side)  # fmt: skip


@pytest.fixture(scope="module", params=KINDS)
def kind_dirs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, Path]:
    """Return (kind, checkpoint dir, version dir) of one tokenizer kind."""
    tmp = tmp_path_factory.mktemp(f"tok-{request.param}")
    checkpoint = write_tokenizer(tmp / "ckpt", request.param)
    return request.param, checkpoint, _version(tmp, checkpoint)


def _reference(checkpoint: Path, side: str = "right") -> object:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    reference.truncation_side = side
    return reference


def test_export_copies_the_tokenizer_json_byte_for_byte(kind_dirs: tuple[str, Path, Path]) -> None:
    kind, checkpoint, version = kind_dirs
    copied = (version / "assets" / "tokenizer.json").read_bytes()

    assert copied == (checkpoint / "tokenizer.json").read_bytes()
    entry = json.loads((version / "assets" / "model.json").read_text())["tokenizer"]
    assert entry["file"] == "tokenizer.json" and entry["source"] == "tokenizer.json"
    pair = {"wordpiece": "[CLS] $A [SEP] $B:1 [SEP]:1", "bpe": "<s> $A </s> </s> $B </s>",
            "unigram": "<s> $A </s> </s> $B </s>", "unigram-cls": "[CLS] $A [SEP] $B:1 [SEP]:1",
            "sp-bpe": "<s> $A </s> $B:1 </s>:1"}  # fmt: skip
    assert entry["pair_template"] == pair[kind]


@pytest.mark.parametrize("side", ["right", "left"])
def test_ids_and_truncation_match_transformers(
    kind_dirs: tuple[str, Path, Path], side: str
) -> None:
    _, checkpoint, version = kind_dirs
    ours, reference = _ours(version), _reference(checkpoint, side)

    got = [(e.ids.tolist(), e.truncated) for e in ours.encode(TEXTS, direction=side)]
    want = []
    for text in TEXTS:
        full = reference(text)["input_ids"]  # type: ignore[operator]
        cut = reference(text, truncation=True, max_length=MAX_LEN)["input_ids"]  # type: ignore[operator]
        want.append((cut, len(full) > MAX_LEN))

    assert got == want
    assert any(cut for _, cut in got)  # the corpus has texts over MAX_LEN


def test_offsets_and_special_masks_match_transformers(kind_dirs: tuple[str, Path, Path]) -> None:
    _, checkpoint, version = kind_dirs
    ours, reference = _ours(version, max_len=512), _reference(checkpoint)

    for text, described in zip(TEXTS, ours.describe(TEXTS), strict=True):
        want = reference(text, return_offsets_mapping=True, return_special_tokens_mask=True)  # type: ignore[operator]
        assert described["ids"] == want["input_ids"], text
        assert described["offsets"] == [list(o) for o in want["offset_mapping"]], text
        assert described["special"] == [bool(m) for m in want["special_tokens_mask"]], text
        assert described["tokens"] == reference.convert_ids_to_tokens(want["input_ids"])  # type: ignore[attr-defined]


@pytest.mark.parametrize("side", ["right", "left"])
def test_pairs_match_transformers_longest_first(
    kind_dirs: tuple[str, Path, Path], side: str
) -> None:
    _, checkpoint, version = kind_dirs
    ours, reference = _ours(version), _reference(checkpoint, side)

    got = ours.encode_pairs(PAIRS, direction=side)

    for (a, b), encoded in zip(PAIRS, got, strict=True):
        want = reference(a, b, truncation="longest_first", max_length=MAX_LEN,  # type: ignore[operator]
                         return_token_type_ids=True)  # fmt: skip
        assert encoded.ids.tolist() == want["input_ids"], (a, b)
        assert encoded.type_ids is not None
        assert encoded.type_ids.tolist() == want["token_type_ids"], (a, b)


def test_a_pair_whose_first_text_fills_the_model_is_refused(
    kind_dirs: tuple[str, Path, Path],
) -> None:
    _, _, version = kind_dirs
    with pytest.raises(FirstSegmentTooLong):
        _ours(version).encode_pairs([("the quick brown fox jumps over the lazy dog " * 6, "x")])


def test_windows_keep_their_overlap_and_end_at_the_text_end(
    kind_dirs: tuple[str, Path, Path],
) -> None:
    _, _, version = kind_dirs
    ours = _ours(version)
    text = "the quick brown fox jumps over the lazy dog " * 8
    body = ours._bodies([text])[0]

    windows = ours.windows([text])[0]

    layout = ours.layout
    assert len(windows) > 1
    for window in windows:
        ids = window.ids.tolist()
        assert len(ids) <= MAX_LEN
        assert ids[: len(layout.prefix.ids)] == list(layout.prefix.ids)
        assert ids[len(ids) - len(layout.suffix.ids) :] == list(layout.suffix.ids)
    last = windows[-1].ids.tolist()
    assert last[len(layout.prefix.ids) : len(last) - len(layout.suffix.ids)] == body[-(
        MAX_LEN - layout.single_specials):]  # fmt: skip


@pytest.mark.parametrize("aggregation", ["none", "simple", "first"])
def test_tag_entities_match_the_token_classification_pipeline(
    kind_dirs: tuple[str, Path, Path], aggregation: str
) -> None:
    import torch
    from transformers import BertConfig, BertForTokenClassification, pipeline

    _, checkpoint, version = kind_dirs
    ours, reference = _ours(version, max_len=512), _reference(checkpoint)
    labels = ["O", "B-ORDER", "I-ORDER", "B-EMAIL", "I-EMAIL"]
    torch.manual_seed(0)
    model = BertForTokenClassification(BertConfig(
        vocab_size=ours.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, num_labels=len(labels),
        id2label=dict(enumerate(labels)), label2id={x: i for i, x in enumerate(labels)},
    )).eval()  # fmt: skip
    tagger = pipeline("token-classification", model=model, tokenizer=reference,
                      aggregation_strategy=aggregation)  # fmt: skip

    for text in TEXTS[:12]:
        windows = ours.tag_windows(text, stride=0)
        with torch.no_grad():
            rows = [model(input_ids=torch.tensor([w.encoded.ids.tolist()])).logits[0].numpy()
                    for w in windows]  # fmt: skip
        got = tag_text(text, windows, rows, aggregation, labels, ours.unk_id,
                       word_aware=ours.word_aware)  # fmt: skip
        want = tagger(text)
        key = "entity" if aggregation == "none" else "entity_group"
        assert [(e["label"], e["start"], e["end"]) for e in got] == [
            (w[key], w["start"], w["end"])
            for w in want  # type: ignore[index]
        ], text
        assert np.allclose([e["score"] for e in got], [w["score"] for w in want], atol=1e-5)  # type: ignore[index]


def test_a_vocab_txt_checkpoint_gets_the_tokenizer_bert_tokenizer_fast_makes(
    tmp_path: Path, tiny_vocab_file: Path
) -> None:
    from transformers import BertTokenizerFast

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "vocab.txt").write_bytes(tiny_vocab_file.read_bytes())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    rows = len(tiny_vocab_file.read_text().splitlines())
    version = _version(tmp_path, checkpoint, rows)
    reference = BertTokenizerFast(str(tiny_vocab_file), do_lower_case=False)

    ours = _ours(version, max_len=512)

    entry = json.loads((version / "assets" / "model.json").read_text())["tokenizer"]
    assert entry["source"] == "vocab.txt" and entry["model"] == "WordPiece"
    assert (version / "assets" / "vocab.txt").read_text().splitlines() == (
        tiny_vocab_file.read_text().splitlines()[:rows]
    )
    for text, described in zip(TEXTS, ours.describe(TEXTS), strict=True):
        want = reference(text, return_offsets_mapping=True)
        assert described["ids"] == want["input_ids"], text
        assert described["offsets"] == [list(o) for o in want["offset_mapping"]], text


def test_minilms_tokenizer_json_and_its_vocab_txt_tokenize_alike(minilm_vocab_file: Path) -> None:
    """A demo version exported before tokenizer.json (vocab.txt only) and one exported now
    (the checkpoint's tokenizer.json) send the model the same tokens."""
    from tokenizers import Tokenizer

    from backend.tokenization import BertTokenizer

    legacy = BertTokenizer.from_files(minilm_vocab_file, max_seq_len=MAX_LEN)
    own = TextTokenizer(Tokenizer.from_file(str(minilm_vocab_file.parent / "tokenizer.json")),
                        max_seq_len=MAX_LEN, pad_id=0, unk_id=100)  # fmt: skip

    assert [e.ids.tolist() for e in own.encode(CORPUS)] == [
        e.ids.tolist() for e in legacy.encode(CORPUS)
    ]
    assert own.describe(CORPUS) == legacy.describe(CORPUS)
    pairs = [("hello world", "my card was charged twice"), ("Café", "我的订单还没到")]
    assert [(e.ids.tolist(), e.type_ids.tolist()) for e in own.encode_pairs(pairs)] == [  # type: ignore[union-attr]
        (e.ids.tolist(), e.type_ids.tolist())
        for e in legacy.encode_pairs(pairs)  # type: ignore[union-attr]
    ]

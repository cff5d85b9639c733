"""The heads finetune trains, one class each: its file, its encoding, its loss, its figures, its
config.json keys.

``classify`` (one text, softmax), ``pair-classify`` (two segments, ``token_type_ids`` 1 on the
second; with one logit a cross-encoder trained with binary cross-entropy), ``multi-label``
(independent sigmoids, binary cross-entropy, a threshold per label tuned on dev) and ``tag`` (BIO
tags on the first token of each of the tokenizer's words, loss there only, span-exact entity F1).
The training
loop (finetune/training.py) asks a task for its loss and its dev figure; finetune/run.py for the
rest. TensorFlow is imported inside the loss functions only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from backend.tokenization import TextTokenizer
from finetune.data import (
    DEFAULT_LABEL_DELIMITER,
    EntityExamples,
    Examples,
    MultiLabelExamples,
    PairExamples,
    check_train_set,
    read_entities,
    read_examples,
    read_multi_label,
    read_pairs,
    refuse_bad_rows,
)
from finetune.errors import FinetuneError
from finetune.metrics import (
    best_threshold,
    bio_entities,
    entity_f1,
    multi_label_f1,
    rerank_scores,
    scores,
)
from finetune.pipeline import pair_token_ids, token_ids
from finetune.training import Split, tokenize_split
from modelformat.heads import MULTI, SINGLE

TASKS = ("classify", "pair-classify", "multi-label", "tag")
IGNORE = -100  # the label of positions the tag loss skips (transformers' ignore_index)
# The label sets a one-logit relevance head accepts, (negative, positive).
RELEVANCE_LABELS = (("0", "1"), ("irrelevant", "relevant"))
RANK_AT = 10


@dataclass(frozen=True)
class TaskOptions:
    """The command line's task settings."""

    task: str = "classify"
    num_labels: int | None = None  # pair-classify: 1 = a one-logit cross-encoder
    label_delimiter: str = DEFAULT_LABEL_DELIMITER


class Task:
    """Single-text, single-label classification (softmax, cross-entropy): the default."""

    name = "classify"
    model_task = "classify"  # export's EncoderModule head: "classify" (pooled) or "tag" (per token)
    selection = "accuracy"  # the dev figure that picks the best epoch
    label_pad = 0

    def __init__(self, options: TaskOptions) -> None:
        self.options = options
        self.labels: list[str] = []

    # -- data --------------------------------------------------------------------------------
    def read(self, path: Any, known: Sequence[str] | None) -> Any:
        """Return a split's examples (``known``: the training set's labels, for dev and test)."""
        return read_examples(path, known)

    def label_set(self, train: Any) -> list[str]:
        """Return the labels the head is trained on (sorted), refusing unusable training sets."""
        return check_train_set(train)

    def known(self) -> list[str]:
        """Return what dev and test labels must be one of."""
        return self.labels

    def encode(self, tokenizer: TextTokenizer, full: TextTokenizer, examples: Any, pipeline: str
               ) -> Split:  # fmt: skip
        """Return a split tokenized for training and evaluation (``full``: the same tokenizer
        without a length limit, for tasks that cut after aligning)."""
        index = {label: i for i, label in enumerate(self.labels)}
        split = tokenize_split(tokenizer, examples.texts, [index[y] for y in examples.labels],
                               pipeline)  # fmt: skip
        split.examples = examples
        return split

    # -- training ----------------------------------------------------------------------------
    def target_spec(self) -> Any:
        """Return the ``tf.TensorSpec`` of a batch's targets."""
        import tensorflow as tf

        return tf.TensorSpec([None], tf.int32)

    def targets(self, split: Split) -> Any:
        """Return the split's targets as ``optimised_dataset`` takes them."""
        return split.label_ids

    def loss(self, logits: Any, targets: Any) -> Any:
        """Return the mean loss of a batch (float32 logits)."""
        import tensorflow as tf

        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
        )

    def dev_score(self, split: Split, logits: list[np.ndarray]) -> float:
        """Return the figure the best epoch is chosen by."""
        return float(self.figures(split, logits)[self.selection])

    # -- results -----------------------------------------------------------------------------
    def figures(self, split: Split, logits: list[np.ndarray]) -> dict[str, Any]:
        """Return the split's metrics from its per-row logits (file order)."""
        predicted = [int(np.argmax(row)) for row in logits]
        return scores(split.label_ids, predicted, self.labels)

    def finish(self, dev: Split, dev_logits: list[np.ndarray]) -> None:
        """Settle what is tuned on dev after training (multi-label thresholds)."""

    def config(self) -> dict[str, Any]:
        """Return the config.json keys of this head (beyond id2label/label2id)."""
        return {"architectures": ["BertForSequenceClassification"], "problem_type": SINGLE}

    def headline(self, figures: dict[str, Any]) -> str:
        """Return a split's figures in a few words, for the summary line."""
        return f"accuracy {figures['accuracy']:.4f}, macro-F1 {figures['macro_f1']:.4f}"


class PairTask(Task):
    """Sentence pairs in the checkpoint's pair template; softmax over labels, or one relevance
    logit."""

    name = "pair-classify"

    def __init__(self, options: TaskOptions) -> None:
        super().__init__(options)
        self._negative = ""  # a one-logit head's negative label (0 or irrelevant)

    @property
    def one_logit(self) -> bool:
        """Whether the head is a one-logit cross-encoder (sigmoid, binary cross-entropy)."""
        return self.options.num_labels == 1

    def read(self, path: Any, known: Sequence[str] | None) -> PairExamples:
        return read_pairs(path, known)

    def label_set(self, train: PairExamples) -> list[str]:
        if not train.labels:
            raise FinetuneError(f"{train.path}: the training set has no examples")
        found = sorted(set(train.labels))
        if self.one_logit:
            for negative, positive in RELEVANCE_LABELS:
                if set(found) <= {negative, positive}:
                    if len(found) < 2:
                        raise FinetuneError(
                            f"{train.path}: a relevance head needs both {negative!r} and "
                            f"{positive!r} rows; the training set has only {found[0]!r}"
                        )
                    self._negative = negative
                    return [positive]
            raise FinetuneError(
                f"{train.path}: --num-labels 1 trains a relevance score; its labels must be "
                f"0/1 or irrelevant/relevant, got {', '.join(found)}"
            )
        if self.options.num_labels not in (None, len(found)):
            raise FinetuneError(
                f"{train.path}: --num-labels {self.options.num_labels} but the training set has "
                f"{len(found)} labels ({', '.join(found)})"
            )
        return check_train_set(Examples(texts=train.texts_a, labels=train.labels,
                                        path=train.path))  # fmt: skip

    def known(self) -> list[str]:
        return [self._negative, *self.labels] if self.one_logit else self.labels

    def encode(self, tokenizer: TextTokenizer, full: TextTokenizer, examples: PairExamples,
               pipeline: str) -> Split:  # fmt: skip
        ids, types = pair_token_ids(tokenizer, examples.texts_a, examples.texts_b)
        if self.one_logit:
            label_ids = [int(y == self.labels[0]) for y in examples.labels]
        else:
            index = {label: i for i, label in enumerate(self.labels)}
            label_ids = [index[y] for y in examples.labels]
        return Split(texts=list(examples.texts_a), label_ids=label_ids, ids=ids, types=types,
                     examples=examples)  # fmt: skip

    def loss(self, logits: Any, targets: Any) -> Any:
        import tensorflow as tf

        if not self.one_logit:
            return super().loss(logits, targets)
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=tf.cast(targets, tf.float32), logits=logits[:, 0]))  # fmt: skip

    def _positive(self) -> int | None:
        """Return the label index whose probability ranks documents (None: not a relevance set)."""
        if self.one_logit:
            return 0
        for _negative, positive in RELEVANCE_LABELS:
            if sorted(self.labels) == sorted((_negative, positive)):
                return self.labels.index(positive)
        return None

    def figures(self, split: Split, logits: list[np.ndarray]) -> dict[str, Any]:
        stacked = np.stack(logits) if logits else np.zeros((0, len(self.labels)), np.float32)
        if self.one_logit:
            relevance = 1.0 / (1.0 + np.exp(-stacked[:, 0]))
            predicted = (stacked[:, 0] > 0).astype(int).tolist()
            out = scores(split.label_ids, predicted, [self._negative, self.labels[0]])
        else:
            out = scores(split.label_ids, stacked.argmax(-1).tolist(), self.labels)
            positive = self._positive()
            shifted = np.exp(stacked - stacked.max(-1, keepdims=True))
            relevance = (shifted / shifted.sum(-1, keepdims=True))[:, positive or 0]
        if self._positive() is not None:
            truth = [float(y == self._positive()) if not self.one_logit else float(y)
                     for y in split.label_ids]  # fmt: skip
            out["rerank"] = rerank_scores(split.texts, relevance.tolist(), truth, RANK_AT)
        return out

    def config(self) -> dict[str, Any]:
        if self.one_logit:
            # what cross-encoder checkpoints (sentence-transformers, ms-marco-MiniLM) carry: one
            # label and no problem_type, so transformers' pipeline scores with a sigmoid
            return {
                "architectures": ["BertForSequenceClassification"], "text_pair": True,
                "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"},
            }  # fmt: skip
        return {**super().config(), "text_pair": True}

    def headline(self, figures: dict[str, Any]) -> str:
        rerank = figures.get("rerank")
        extra = f", MRR@{RANK_AT} {rerank[f'mrr@{RANK_AT}']:.4f}" if rerank else ""
        return f"accuracy {figures['accuracy']:.4f}{extra}"


class MultiLabelTask(Task):
    """Several labels per text: a sigmoid per label, binary cross-entropy, tuned thresholds."""

    name = "multi-label"
    selection = "micro_f1"

    def __init__(self, options: TaskOptions) -> None:
        super().__init__(options)
        self.thresholds: dict[str, float] = {}

    def read(self, path: Any, known: Sequence[str] | None) -> MultiLabelExamples:
        return read_multi_label(path, known, self.options.label_delimiter)

    def label_set(self, train: MultiLabelExamples) -> list[str]:
        if not train.texts:
            raise FinetuneError(f"{train.path}: the training set has no examples")
        found = sorted({label for labels in train.labels for label in labels})
        if len(found) < 2:
            raise FinetuneError(
                f"{train.path}: the training set has one label only ({found[0]!r}); a "
                "multi-label head needs at least two"
            )
        return found

    def encode(self, tokenizer: TextTokenizer, full: TextTokenizer,
               examples: MultiLabelExamples, pipeline: str) -> Split:  # fmt: skip
        index = {label: i for i, label in enumerate(self.labels)}
        matrix = np.zeros((len(examples), len(self.labels)), np.float32)
        for row, labels in enumerate(examples.labels):
            matrix[row, [index[y] for y in labels]] = 1.0
        return Split(texts=list(examples.texts), label_ids=[], ids=token_ids(tokenizer,
                     examples.texts), targets=matrix, examples=examples)  # fmt: skip

    def target_spec(self) -> Any:
        import tensorflow as tf

        return tf.TensorSpec([None, len(self.labels)], tf.float32)

    def targets(self, split: Split) -> Any:
        return split.targets

    def loss(self, logits: Any, targets: Any) -> Any:
        import tensorflow as tf

        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=targets,
                                                                      logits=logits))  # fmt: skip

    @staticmethod
    def _probabilities(logits: list[np.ndarray]) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-np.stack(logits).astype(np.float64)))

    def figures(self, split: Split, logits: list[np.ndarray]) -> dict[str, Any]:
        probs = self._probabilities(logits)
        cut = np.array([self.thresholds.get(label, 0.5) for label in self.labels])
        out = multi_label_f1(split.targets, probs >= cut, self.labels)
        if self.thresholds:
            at_half = multi_label_f1(split.targets, probs >= 0.5, self.labels)
            out["at_0.5"] = {k: at_half[k] for k in ("micro_f1", "macro_f1")}
        out["thresholds"] = "tuned on dev" if self.thresholds else "0.5"
        return out

    def dev_score(self, split: Split, logits: list[np.ndarray]) -> float:
        """Return dev micro-F1 with thresholds tuned on dev at this epoch: the rule the output
        will use. At a fixed 0.5 an early epoch whose sigmoids all sit below 0.5 (every label is
        rare) scores 0 and the epochs could not be told apart."""
        self.finish(split, logits)
        try:
            return float(self.figures(split, logits)["micro_f1"])
        finally:
            self.thresholds = {}

    def finish(self, dev: Split, dev_logits: list[np.ndarray]) -> None:
        probs = self._probabilities(dev_logits)
        self.thresholds = {
            label: round(best_threshold(probs[:, j], dev.targets[:, j]), 6)
            for j, label in enumerate(self.labels)
        }

    def config(self) -> dict[str, Any]:
        return {"architectures": ["BertForSequenceClassification"], "problem_type": MULTI,
                "thresholds": dict(self.thresholds)}  # fmt: skip

    def headline(self, figures: dict[str, Any]) -> str:
        return f"micro-F1 {figures['micro_f1']:.4f}, macro-F1 {figures['macro_f1']:.4f}"


@dataclass(frozen=True)
class Word:
    """A word of a tokenized text: its first token's position and its character span (without
    the spaces a token may carry; ``start == end`` for a word of whitespace only)."""

    token: int
    start: int
    end: int


class TagTask(Task):
    """Token classification: entity spans → BIO tags on the first token of each word.

    A word is what the checkpoint's own tokenizer calls one (HF ``Encoding.word_ids``: BERT's
    pre-tokenizer splits at spaces, punctuation and CJK characters; byte-level BPE's at spaces,
    letters/digits/other runs, ``Ġ`` carrying the space; SentencePiece's at spaces, ``▁``
    carrying it), as transformers' token-classification scripts align labels: the word's tag on
    its first token, ``IGNORE`` on the rest and on the special tokens. An entity boundary that
    falls between two tokens of one word next to punctuation or a CJK character (``March:`` with
    SentencePiece, entity ``March``) splits that word there, as BERT's words would; one between
    two letters or digits, or inside a token, is refused.
    """

    name = "tag"
    model_task = "tag"
    selection = "micro_f1"
    label_pad = IGNORE

    def read(self, path: Any, known: Sequence[str] | None) -> EntityExamples:
        return read_entities(path, known)

    def label_set(self, train: EntityExamples) -> list[str]:
        if not train.texts:
            raise FinetuneError(f"{train.path}: the training set has no examples")
        types = sorted({span.label for spans in train.entities for span in spans})
        if not types:
            raise FinetuneError(f"{train.path}: the training set has no entities")
        return ["O", *(f"{prefix}-{kind}" for kind in types for prefix in ("B", "I"))]

    def known(self) -> list[str]:
        return sorted({label[2:] for label in self.labels if label != "O"})

    def encode(self, tokenizer: TextTokenizer, full: TextTokenizer, examples: EntityExamples,
               pipeline: str) -> Split:  # fmt: skip
        index = {label: i for i, label in enumerate(self.labels)}
        keep = tokenizer.max_seq_len - 1  # tokens before the closing [SEP]
        ids, targets, words, bad = [], [], [], []
        truncated = 0
        for text, spans, line in zip(examples.texts, examples.entities, examples.lines,
                                     strict=True):  # fmt: skip
            described = full.describe([text])[0]
            cuts = {b for span in spans for b in (span.start, span.end)}
            row_words = _words(text, described, full.word_ids([text])[0], cuts)
            tags, reason = _bio(row_words, spans)
            if reason:
                bad.append(f"line {line}: {reason}")
                continue
            row_ids = np.asarray(described["ids"], np.int32)
            labels = np.full(len(row_ids), IGNORE, np.int32)
            for word, tag in zip(row_words, tags, strict=True):
                labels[word.token] = index[tag]
            # entities are read back from the words with text (a whitespace word has none)
            row_words = [w for w in row_words if w.start < w.end]
            if len(row_ids) > tokenizer.max_seq_len:
                truncated += 1
                row_ids = np.concatenate([row_ids[:keep], row_ids[-1:]])
                labels = np.concatenate([labels[:keep], [IGNORE]]).astype(np.int32)
                row_words = [w for w in row_words if w.token < keep]
            ids.append(row_ids)
            targets.append(labels)
            words.append(row_words)
        refuse_bad_rows(examples.path, bad)
        return Split(texts=list(examples.texts), label_ids=[], ids=ids, targets=targets,
                     examples=examples, words=words, truncated=truncated)  # fmt: skip

    def target_spec(self) -> Any:
        import tensorflow as tf

        return tf.TensorSpec([None, None], tf.int32)

    def targets(self, split: Split) -> Any:
        return split.targets

    def loss(self, logits: Any, targets: Any) -> Any:
        import tensorflow as tf

        # the mean over first word pieces only: continuation pieces, specials and padding skipped
        counted = tf.cast(tf.not_equal(targets, IGNORE), tf.float32)
        safe = tf.where(targets == IGNORE, tf.zeros_like(targets), targets)
        each = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=safe, logits=logits)
        return tf.reduce_sum(each * counted) / tf.maximum(tf.reduce_sum(counted), 1.0)

    def predicted_entities(
        self, words: list[Word], logits: np.ndarray
    ) -> set[tuple[int, int, str]]:
        """Return one text's predicted entities (start, end, type) from its per-token logits."""
        tags = [self.labels[int(np.argmax(logits[w.token]))] for w in words]
        return {(words[first].start, words[last].end, kind)
                for first, last, kind in bio_entities(tags)}  # fmt: skip

    def figures(self, split: Split, logits: list[np.ndarray]) -> dict[str, Any]:
        predicted = [self.predicted_entities(w, row) for w, row in zip(split.words, logits,
                                                                        strict=True)]  # fmt: skip
        gold = [{(s.start, s.end, s.label) for s in spans} for spans in split.examples.entities]
        out = entity_f1(gold, predicted)
        out["micro_f1"] = out["micro"]["f1"]
        out["truncated_texts"] = split.truncated
        return out

    def config(self) -> dict[str, Any]:
        return {"architectures": ["BertForTokenClassification"], "label_scheme": "BIO"}

    def headline(self, figures: dict[str, Any]) -> str:
        micro = figures["micro"]
        return (f"entity F1 {micro['f1']:.4f} (P {micro['precision']:.4f}, "
                f"R {micro['recall']:.4f})")  # fmt: skip


def _is_cjk(char: str) -> bool:
    """Whether ``char`` is a CJK ideograph (BERT's ``_is_chinese_char`` blocks)."""
    code = ord(char)
    return any(low <= code <= high for low, high in (
        (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
    ))  # fmt: skip


def _joins(text: str, at: int) -> bool:
    """Whether character position ``at`` lies between two letters or digits (not CJK): inside
    what every tokenizer kind keeps as one word, where an entity may not start or end."""
    if not 0 < at < len(text):
        return False
    return all(c.isalnum() and not _is_cjk(c) for c in text[at - 1 : at + 1])


def _content(text: str, start: int, end: int) -> tuple[int, int]:
    """Return the span ``[start, end)`` of ``text`` without whitespace at either side."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _words(
    text: str, described: dict[str, Any], word_ids: Sequence[int | None], cuts: set[int]
) -> list[Word]:
    """Return the words of a described text, in order: each run of tokens the tokenizer gives
    one word id (``TextTokenizer.word_ids``), split again before a token that starts at one of
    ``cuts`` (entity boundaries) or after one that ends at one, unless letters or digits join
    there (``_joins``). A word spans its tokens' characters without surrounding spaces (a
    ``Ġword`` or ``▁word`` token's offsets may include the space before it)."""
    words: list[Word] = []
    tokens: list[int] = []  # the positions of the word being read
    span: list[int] = []  # its [start, end) so far; empty while it has only whitespace

    def close() -> None:
        if tokens:
            at = int(described["offsets"][tokens[0]][0])
            words.append(Word(tokens[0], *(span or (at, at))))
        tokens.clear()
        span.clear()

    last = None
    for i, (word, special, (start, end)) in enumerate(
        zip(word_ids, described["special"], described["offsets"], strict=True)
    ):
        if special or word is None:
            close()
            last = None
            continue
        start, end = _content(text, int(start), int(end))
        # an entity boundary between this token and the word's text before it
        boundary = (
            bool(span)
            and start < end
            and start >= span[1]
            and any(b in cuts and not _joins(text, b) for b in {start, span[1]})
        )
        if word != last or boundary:
            close()
        last = word
        tokens.append(i)
        if start < end:
            span[:] = [span[0], end] if span else [start, end]
    close()
    return words


def _bio(words: list[Word], spans: Sequence[Any]) -> tuple[list[str], str]:
    """Return the words' BIO tags for ``spans``, or a reason the spans do not fit the words.
    A whitespace word inside an entity continues it; elsewhere it is ``O``."""
    tags = ["O"] * len(words)
    real = [i for i, w in enumerate(words) if w.start < w.end]
    starts = {words[i].start: i for i in real}
    ends = {words[i].end: i for i in real}
    for span in spans:
        first, last = starts.get(span.start), ends.get(span.end)
        if first is None or last is None or last < first:
            side = "start" if first is None else "end"
            return tags, (
                f"entity [{span.start}, {span.end}) {span.label!r} does not {side} at a word "
                "boundary of the checkpoint's tokenizer (its words; or punctuation or a CJK "
                "character between two of a word's tokens)"
            )
        tags[first] = f"B-{span.label}"
        for i in range(first + 1, last + 1):
            tags[i] = f"I-{span.label}"
    return tags, ""


def make_task(options: TaskOptions) -> Task:
    """Return the task object for ``options.task``; refuse settings that do not fit it."""
    kinds = {"classify": Task, "pair-classify": PairTask, "multi-label": MultiLabelTask,
             "tag": TagTask}  # fmt: skip
    if options.task not in kinds:
        raise FinetuneError(f"task must be one of {list(TASKS)}, got {options.task!r}")
    if options.num_labels is not None and options.task != "pair-classify":
        raise FinetuneError("--num-labels is for --task pair-classify (1: a cross-encoder)")
    if options.num_labels is not None and options.num_labels < 1:
        raise FinetuneError(f"--num-labels must be at least 1, got {options.num_labels}")
    return kinds[options.task](options)

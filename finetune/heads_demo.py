"""``python -m finetune.heads_demo``: fine-tune all-MiniLM-L6-v2 for the three other heads, export
each as the next version of its model, and score every exported version on its test split the
way the gateway serves it.

- ``minilm-pairs``: a one-logit cross-encoder on data/pairs (ticket × help-centre article,
  relevant or not): pair accuracy, and MRR@10 / nDCG@10 of every test ticket's ranking of all
  63 articles by cosine of the ``minilm`` embeddings, then with cosine's top 20 reranked by it;
- ``minilm-ner``: a token classifier on data/entities: span-exact entity F1, micro and per type,
  on the entities the gateway's ``:tag`` answers (aggregation ``first``, windows as served);
- ``minilm-topics``: a multi-label classifier on data/tickets-multilabel: micro / macro F1 with
  the per-label thresholds tuned on dev.

Each export is scored in process (export's persistent predictor) with the gateway's own
tokenizer, length buckets, tagging and post-processing code, so the figures are what a client
gets. ``--reuse`` skips training a head whose ``--keep`` checkpoint already exists.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from finetune.demo import Served, minilm_dir
from finetune.errors import FinetuneError
from finetune.tasks import TaskOptions
from finetune.training import TrainConfig
from modelformat.errors import FormatError

DATA = Path(__file__).resolve().parent.parent / "data"
RANK_AT = 10
Say = Callable[[str], None]


@dataclass(frozen=True)
class HeadDemo:
    """One head of the demo: its data, training settings and the model it is served as."""

    model: str
    data: str
    suffix: str
    task: TaskOptions
    export_task: str
    max_seq_len: int
    config: TrainConfig = field(default_factory=TrainConfig)

    def split(self, name: str) -> Path:
        """Return the path of split ``name`` (train, dev, test)."""
        return DATA / self.data / f"{name}.{self.suffix}"


# Settings for MiniLM on 2 CPU cores (finetune/README.md "Demo of the other heads"): pairs at
# 64 tokens, where the ticket and the start of the article fit (the median pair is 135 tokens;
# 128 costs twice the time, and one epoch there at lr 7e-5 only learnt the prior); 3 epochs at
# lr 1e-4. A token head starts from random weights and needs more passes, at a higher lr.
HEADS = {
    "pairs": HeadDemo(
        "minilm-pairs", "pairs", "tsv", TaskOptions("pair-classify", num_labels=1), "classify",
        64, TrainConfig(epochs=3, batch_size=16, learning_rate=1e-4, patience=3),
    ),
    "ner": HeadDemo(
        "minilm-ner", "entities", "jsonl", TaskOptions("tag"), "tag", 128,
        TrainConfig(epochs=8, batch_size=16, learning_rate=3e-4, patience=8),
    ),
    "topics": HeadDemo(
        "minilm-topics", "tickets-multilabel", "tsv", TaskOptions("multi-label"), "classify",
        128, TrainConfig(epochs=3, batch_size=32, learning_rate=1e-4),
    ),
}  # fmt: skip


# -- scoring, one function per head -------------------------------------------------------------


def score_pairs(served: Served, embedder: Served, depth: int, say: Say) -> dict[str, Any]:
    """Return pair accuracy on test.tsv, and MRR@10 / nDCG@10 of every test ticket's ranking of
    all articles: by cosine of ``embedder``'s embeddings, and with cosine's top ``depth`` (0: all)
    reranked by the cross-encoder (retrieve, then rerank: what a search stack runs)."""
    from backend.postprocessing import sigmoid
    from finetune.metrics import mrr_at_k, ndcg_at_k

    rows = [line.split("\t") for line in _lines(DATA / "pairs" / "test.tsv")]
    # a ticket that alone fills max_seq_len is refused by the gateway (422): left out, counted
    fits = _fits(served, {a for a, _, _ in rows})
    refused = sum(1 for a, _, _ in rows if a not in fits)
    rows = [row for row in rows if row[0] in fits]
    encoded = served.tokenizer.encode_pairs([(a, b) for a, b, _ in rows])
    scores = sigmoid(np.asarray([v[0] for v in served.run(encoded, "logits")], np.float64))
    truth = np.asarray([label == "relevant" for _, _, label in rows])
    figures: dict[str, Any] = {"pairs": len(rows), "refused_pairs": refused,
                               "accuracy": float(((scores >= 0.5) == truth).mean())}  # fmt: skip
    table = (line.split("\t") for line in _lines(DATA / "pairs" / "articles.tsv"))
    articles = {row[0]: row[3] for row in table}
    relevant: dict[str, set[str]] = {}
    for ticket, article in (line.split("\t") for line in _lines(DATA / "pairs" / "test_qrels.tsv")):
        relevant.setdefault(ticket, set()).add(article)
    tickets, ids = [t for t in relevant if t in _fits(served, set(relevant))], list(articles)
    figures["refused_queries"] = len(relevant) - len(tickets)
    vectors = embedder.run(embedder.tokenizer.encode([*tickets, *(articles[a] for a in ids)]),
                           "embedding")  # fmt: skip
    matrix = np.stack(vectors)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    cosine = matrix[: len(tickets)] @ matrix[len(tickets) :].T
    by_cosine = [[ids[j] for j in np.argsort(-row, kind="stable")] for row in cosine]
    depth = depth or len(ids)
    pairs = list(zip(tickets, by_cosine, strict=True))
    candidates = [(t, a) for t, order in pairs for a in order[:depth]]
    say(f"reranking cosine's top {depth} of {len(ids)} articles for {len(tickets)} test tickets "
        f"({len(candidates)} pairs)")  # fmt: skip
    logits = served.run(served.tokenizer.encode_pairs([(t, articles[a]) for t, a in candidates]),
                        "logits")  # fmt: skip
    ce = np.asarray([v[0] for v in logits], np.float64).reshape(len(tickets), -1)
    reranked = []
    for order, row in zip(by_cosine, ce, strict=True):
        top = [order[j] for j in np.argsort(-row, kind="stable")]  # ties keep cosine's order
        reranked.append(top + order[depth:])
    for name, rankings in (("cosine", by_cosine), ("cross-encoder", reranked)):
        lists = [[float(a in relevant[t]) for a in order]
                 for t, order in zip(tickets, rankings, strict=True)]  # fmt: skip
        figures[name] = {f"mrr@{RANK_AT}": mrr_at_k(lists, RANK_AT),
                         f"ndcg@{RANK_AT}": ndcg_at_k(lists, RANK_AT)}  # fmt: skip
    hits = [bool(relevant[t] & set(order[:depth])) for t, order in pairs]
    figures.update(queries=len(tickets), depth=depth, articles=len(ids),
                   recall_at_depth=float(np.mean(hits)))  # fmt: skip
    return figures


def _fits(served: Served, firsts: set[str]) -> set[str]:
    """Return the first segments that leave room for a second within max_seq_len."""
    from backend.tokenization import FirstSegmentTooLong

    fits = set()
    for text in firsts:
        try:
            served.tokenizer.encode_pairs([(text, "")])
        except FirstSegmentTooLong:
            continue
        fits.add(text)
    return fits


def score_ner(served: Served) -> dict[str, Any]:
    """Return span-exact entity F1 (micro and per type) of the entities :tag answers on
    test.jsonl (aggregation ``first``, the gateway's windows)."""
    from backend.tagging import tag_text, window_stride
    from finetune.metrics import entity_f1

    texts, gold = [], []
    for line in _lines(DATA / "entities" / "test.jsonl", header=False):
        row = json.loads(line)
        texts.append(row["text"])
        gold.append([(e["start"], e["end"], e["label"]) for e in row["entities"]])
    stride = window_stride(served.max_seq_len)  # the gateway's windows
    windows = [served.tokenizer.tag_windows(text, stride) for text in texts]
    flat = [w.encoded for text_windows in windows for w in text_windows]
    logits = iter(served.run(flat, "logits"))
    labels, unk = list(served.info["labels"]), served.tokenizer.unk_id
    predicted = []
    for text, text_windows in zip(texts, windows, strict=True):
        rows = [next(logits)[: len(w.encoded.ids)] for w in text_windows]
        found = tag_text(text, text_windows, rows, "first", labels, unk)
        predicted.append([(e["start"], e["end"], e["entity"]) for e in found])
    return {"texts": len(texts), **entity_f1(gold, predicted)}


def score_topics(served: Served, delimiter: str = "|") -> dict[str, Any]:
    """Return micro / macro F1 on test.tsv, each label decided by its threshold in model.json."""
    from backend.postprocessing import sigmoid
    from finetune.metrics import multi_label_f1

    rows = [line.split("\t") for line in _lines(DATA / "tickets-multilabel" / "test.tsv")]
    labels = list(served.info["labels"])
    thresholds = np.asarray([served.info.get("thresholds", {}).get(n, 0.5) for n in labels])
    scores = sigmoid(np.stack(served.run(served.tokenizer.encode([t for t, _ in rows]), "logits")))
    truth = np.asarray([[n in set(tags.split(delimiter)) for n in labels] for _, tags in rows])
    return {"texts": len(rows), **multi_label_f1(truth, scores >= thresholds, labels)}


def _lines(path: Path, header: bool = True) -> list[str]:
    lines = [line for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    return lines[1:] if header else lines


# -- the run ------------------------------------------------------------------------------------


def train_and_export(name: str, base: Path, keep: Path, reuse: bool, precision: str,
                     say: Say) -> Path:  # fmt: skip
    """Fine-tune head ``name`` into ``keep/name`` (unless ``reuse`` and it exists), export it as
    its model's next version under ``base``; return the version's path."""
    from export.build import build
    from finetune.run import finetune
    from modelformat.layout import next_version

    head = HEADS[name]
    out = keep / name
    if reuse and (out / "config.json").is_file():
        say(f"{name}: reusing the checkpoint in {out}")
    else:
        say(f"{name}: fine-tuning MiniLM on data/{head.data} ({head.task.task}, "
            f"{head.config.epochs} epochs, max_seq_len {head.max_seq_len})")  # fmt: skip
        result = finetune(
            minilm_dir(), head.split("train"), head.split("dev"), out,
            test_path=head.split("test"), config=head.config, precision=precision,
            max_seq_len=head.max_seq_len, say=say, task=head.task,
        )  # fmt: skip
        say(result.summary())
    model_dir = base / head.model
    version = next_version(model_dir)
    say(f"exporting {out} as {head.model}/{version}")
    built = build(out, head.model, base, version=version, task=head.export_task,
                  precision="auto", max_seq_len=head.max_seq_len, progress=say)  # fmt: skip
    say(built.summary())
    return built.path


def report(figures: dict[str, dict[str, Any]]) -> str:
    """Return the demo's tables (markdown) for the heads in ``figures``."""
    out = []
    if "pairs" in figures:
        f = figures["pairs"]
        out += [f"minilm-pairs on data/pairs/test.tsv ({f['pairs']} pairs): "
                f"accuracy {f['accuracy']:.3f} (relevant when sigmoid ≥ 0.5)"
                + _refused(f["refused_pairs"], "pairs"), "",
                f"ranking all {f['articles']} articles for {f['queries']} test tickets "
                "(data/pairs/test_qrels.tsv)" + _refused(f["refused_queries"], "tickets") + ":", "",
                f"| ranker | MRR@{RANK_AT} | nDCG@{RANK_AT} |", "|---|---:|---:|",
                f"| minilm embeddings, cosine | {_rank(f['cosine'])} |",
                f"| cosine top {f['depth']} reranked by minilm-pairs | "
                f"{_rank(f['cross-encoder'])} |", "",
                f"(cosine's top {f['depth']} holds a relevant article for "
                f"{f['recall_at_depth']:.1%} of the tickets: a reranker's ceiling)"]  # fmt: skip
        out.append("")
    if "ner" in figures:
        f = figures["ner"]
        micro = f["micro"]
        out += [f"minilm-ner on data/entities/test.jsonl ({f['texts']} tickets), span-exact, "
                f"as :tag answers (aggregation first):", "",
                "| type | precision | recall | F1 | support |", "|---|---:|---:|---:|---:|",
                f"| **micro** | {micro['precision']:.3f} | {micro['recall']:.3f} | "
                f"{micro['f1']:.3f} | {micro['support']} |"]  # fmt: skip
        for kind, t in sorted(f["per_type"].items()):
            out.append(f"| {kind} | {t['precision']:.3f} | {t['recall']:.3f} | {t['f1']:.3f} | "
                       f"{t['support']} |")  # fmt: skip
        out.append("")
    if "topics" in figures:
        f = figures["topics"]
        out += [f"minilm-topics on data/tickets-multilabel/test.tsv ({f['texts']} tickets, "
                f"thresholds tuned on dev): micro-F1 {f['micro_f1']:.3f}, "
                f"macro-F1 {f['macro_f1']:.3f}", ""]  # fmt: skip
    return "\n".join(out)


def _rank(figures: dict[str, float]) -> str:
    return f"{figures[f'mrr@{RANK_AT}']:.3f} | {figures[f'ndcg@{RANK_AT}']:.3f}"


def _refused(n: int, what: str) -> str:
    return (
        f"; {n} {what} left out: the ticket alone fills max_seq_len (the gateway's 422)"
        if n
        else ""
    )


def run_demo(base: Path, heads: Sequence[str], keep: Path | None, reuse: bool,
             precision: str, depth: int = 20) -> int:  # fmt: skip
    """Fine-tune, export and score ``heads``; print the tables; return the exit status."""
    from modelformat.layout import latest_version, version_dir

    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="heads-demo-") as tmp:
        root = keep or Path(tmp)
        for name in heads:
            served = Served(train_and_export(name, base, root, reuse, precision, say))
            say(f"{name}: scoring {served.path} on the test split")
            if name == "pairs":
                newest = latest_version(base / "minilm")
                if newest is None:
                    raise FinetuneError(f"no minilm embedding model under {base}: make models")
                embedder = Served(version_dir(base / "minilm", newest))
                figures[name] = score_pairs(served, embedder, depth, say)
            elif name == "ner":
                figures[name] = score_ner(served)
            else:
                figures[name] = score_topics(served)
    print("\n" + report(figures))
    print(f"total {time.perf_counter() - started:.0f}s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m finetune.heads_demo", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--base-path", type=Path, default=Path("models"))
    parser.add_argument("--heads", nargs="+", choices=list(HEADS), default=list(HEADS))
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto")
    parser.add_argument("--rerank-depth", type=int, default=20,
                        help="how many of cosine's best articles per ticket the cross-encoder "
                        "reranks (0: all)")  # fmt: skip
    parser.add_argument("--keep", type=Path, help="keep each fine-tuned checkpoint in KEEP/<head>")
    parser.add_argument("--reuse", action="store_true",
                        help="with --keep: export the kept checkpoint, don't train")  # fmt: skip
    args = parser.parse_args(argv)
    if args.reuse and args.keep is None:
        parser.error("--reuse needs --keep")
    try:
        return run_demo(args.base_path.resolve(), args.heads, args.keep, args.reuse,
                        args.precision, args.rerank_depth)  # fmt: skip
    except FormatError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

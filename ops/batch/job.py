"""A batch job: plan the input's parts (sorted by length), run each through the gateway's own
stages straight to the model server, write it whole, and resume where a killed run stopped.

The plan is a function of the input alone: the items (lines that passed the route's checks)
sorted by size, then cut into parts of about ``part_rows`` inputs; part ``k`` belongs to shard
``k % n``, which reads back only its own parts' lines (ops/batch/plan.py). Each part's items are
grouped by their options (model, route, prompt...) into calls of up to ``call_rows`` inputs to
``Gateway.embeddings``, which tokenizes, buckets by length and sends chunks of
``GATEWAY_MAX_BATCH`` rows over gRPC (the model server's batching ``max_batch_size``: the
gateway's own calls are sized by it too), ``GATEWAY_MAX_CONCURRENT_CHUNKS`` at once.
Model specs are resolved once, on the job's first start, and recorded in the manifest: a rerun
(or a resumed run) answers from the same versions even when a label has moved since.

What fails where: a row's own fault (a 4xx: over a limit, a text it may not cut) is an error
line and the job goes on; the model server's (unavailable, a timeout, a 5xx) is retried a few
times, then stops the job before the part is written, so a rerun sends those rows again. A call
the model server refuses as larger than its batching limit is never retried as it was: the job
says so once, takes the limit the refusal names for the rest of its calls, and counts it.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from backend.errors import GatewayError, UnprocessableInput, UpstreamError, UpstreamTimeout
from backend.errors import UpstreamUnavailable as Unavailable
from backend.outputs import KINDS
from backend.schemas import EmbedRequest
from backend.service import Gateway
from backend.settings import Settings, load_settings
from ops.batch import parts
from ops.batch.answers import answer_line, embed_line, error_line
from ops.batch.inputs import Bad, Item, error_body, read_batch, read_rows, split_spec
from ops.batch.pacing import Pacer, Yield
from ops.batch.plan import load, scan, windows
from ops.batch.progress import Progress
from ops.tfs_metrics import METRICS_PATH, scrape

RETRIES = 5  # upstream failures of one call before the job stops (a rerun resumes)
# TF Serving's (and modelserver's) refusal of a call over its batching max_batch_size
BATCH_LIMIT = re.compile(r"Task size (\d+) is larger than maximum input batch size (\d+)")


@dataclass
class JobSpec:
    """What a job is asked: its input, output folder, form and how to cut the work."""

    input: Path
    output: Path
    model: str | None = None  # rows: the model spec every row goes to
    id_field: str = "id"
    text_field: str = "text"
    part_rows: int = 2048
    call_rows: int = 512
    shard: tuple[int, int] = (0, 1)
    pacer: Pacer = field(default_factory=Pacer)
    output_format: str | None = None  # "parquet" or "openai"; None: the input form's own
    kinds: tuple[str, ...] = ("dense",)  # Parquet: the output kinds, a column group each
    yields: Yield | None = None  # probe before each call (the command line's default); None: off
    retries: int = RETRIES  # an unavailable or slow model server: tries of a call past the first
    backoff_s: float = 1.0  # the first wait before a retry (doubling, at most 10 s)
    progress_s: float = 5.0  # the progress line's period off a terminal

    @property
    def form(self) -> str:
        """Return the input's form: "rows" (an id and a text per row) or "batch" (OpenAI
        Batch lines)."""
        return "rows" if self.model is not None else "batch"

    @property
    def fmt(self) -> str:
        """Return the output's format: "parquet" (rows' default) or "openai" (OpenAI Batch
        output and error files, the Batch form's default)."""
        return self.output_format or ("parquet" if self.form == "rows" else "openai")

    @property
    def ext(self) -> str:
        """Return the part files' extension."""
        return "parquet" if self.fmt == "parquet" else "jsonl"

    @property
    def manifest_name(self) -> str:
        index, count = self.shard
        return parts.MANIFEST if count == 1 else f"manifest-shard-{index}-of-{count}.json"


@dataclass
class Summary:
    """What a job did: rows written, error lines by status, parts, seconds, rows/s."""

    rows: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    parts: int = 0
    seconds: float = 0.0
    yielded: dict[str, Any] | None = None  # the probes: how many, seconds waited, quiet ms
    refused_calls: int = 0  # calls the model server refused as over its batching limit

    def count_error(self, status: int) -> None:
        self.errors[str(status)] = self.errors.get(str(status), 0) + 1

    def as_dict(self) -> dict[str, Any]:
        """Return the summary as the manifest and stdout show it."""
        rate = self.rows / self.seconds if self.seconds > 0 else 0.0
        return {"rows": self.rows, "errors": dict(sorted(self.errors.items())),
                "error_lines": sum(self.errors.values()), "parts": self.parts,
                "seconds": round(self.seconds, 3), "rows_per_s": round(rate, 1),
                "refused_calls": self.refused_calls,
                **({"yield": self.yielded} if self.yielded is not None else {})}  # fmt: skip


def digest(spec: JobSpec) -> str:
    """Return the job's identity: the input's bytes and every flag that changes the output."""
    hasher = hashlib.sha256()
    with open(spec.input, "rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            hasher.update(block)
    hasher.update(repr((spec.form, spec.model, spec.id_field, spec.text_field,
                        spec.part_rows, spec.fmt, spec.kinds)).encode())  # fmt: skip
    return hasher.hexdigest()


def input_lines(spec: JobSpec, settings: Settings) -> Iterator[Item | Bad]:
    """Yield the input's lines, read in order, as items and bad lines (with Parquet output, also
    the lines that ask for what its columns can't hold)."""
    if spec.model is not None:
        lines = read_rows(spec.input, spec.model, spec.id_field, spec.text_field, settings)
    else:
        lines = read_batch(spec.input, settings)
    for line in lines:
        if isinstance(line, Item) and spec.fmt == "parquet":
            line = _parquet_check(line, spec.kinds)
        yield line


def _parquet_check(item: Item, kinds: tuple[str, ...]) -> Item | Bad:
    """Return ``item``, or a 422 Bad line when Parquet columns can't hold its answer: float32
    vectors of the model's own dimension, the kinds of ``--outputs``."""
    req = item.request
    if req is None:
        return item
    why = None
    if item.route == "openai":
        if req.dimensions is not None or req.embedding_type != "float":
            why = "fields 'dimensions' and 'embedding_type' are not taken"
        elif kinds != ("dense",):
            why = f"/v1/embeddings answers dense vectors only, not {', '.join(kinds)}"
    elif req.embedding_types not in (None, ["float"]):
        why = "field 'embedding_types' is not taken"
    elif req.outputs is not None and tuple(dict.fromkeys(req.outputs)) != kinds:
        why = f"field 'outputs' asks {', '.join(req.outputs)}, the job's --outputs are "
        why += ", ".join(kinds)
    if why is None:
        return item
    error = UnprocessableInput(
        f"{why}: a Parquet output holds float32 vectors of the model's dimension, the columns "
        "of --outputs (use --output-format openai for the route's own answer)"
    )
    return Bad(item.index, item.custom_id, error.status_code, error_body(item.route, error))


def resolve_specs(
    gateway: Gateway, specs: Sequence[str], kinds: tuple[str, ...] = ("dense",)
) -> dict[str, dict[str, Any]]:
    """Return each model spec's served version (or its error: not served, not an embedder,
    without one of ``kinds``), resolved now, once."""
    resolved: dict[str, dict[str, Any]] = {}
    for spec in sorted(set(specs)):
        try:
            name, version, label = split_spec(spec)
            served = gateway.resolver.resolve(name, version, label)
            assets = gateway.assets.get(name, served)
            if assets.task != "embed":
                raise UnprocessableInput(
                    f"model {name!r} is not an embedder (task {assets.task!r})"
                )
            has = assets.outputs.kinds if assets.outputs is not None else ("dense",)
            missing = [kind for kind in kinds if kind not in has]
            if missing:
                raise UnprocessableInput(
                    f"--outputs: model {name!r} version {served} has no {missing[0]} output "
                    f"(its outputs: {', '.join(has)})"
                )
            resolved[spec] = {"model": name, "version": served}
        except GatewayError as exc:
            resolved[spec] = {"status": exc.status_code, "code": exc.code, "message": exc.message}
    return resolved


def plan_parts(items: Sequence[Item], part_rows: int, by_spec: bool = False) -> list[list[Item]]:
    """Return the items sorted by size (then input order), cut into parts of ~part_rows inputs;
    ``by_spec``: sorted by model spec first, a part never holding two (a Parquet part has one
    vector dimension). The job plans from numbers alone (ops/batch/plan.py): the same cut."""
    plan = scan(items, lambda item: None, part_rows, by_spec, keep_bad=False)
    at = {item.index: item for item in items}
    return [[at[int(i)] for i in part] for part in plan.parts]


def _spec_error(item: Item, entry: dict[str, Any]) -> Bad:
    """Return the bad line of an item whose model spec did not resolve at the start."""
    error = GatewayError(entry["message"])
    error.status_code, error.code = entry["status"], entry["code"]
    return Bad(item.index, item.custom_id, entry["status"], error_body(item.route, error))


class _Counted:
    """The gateway's model-server client, counting the job's own Predict calls into
    ``Yield.own`` (the requests rule tells them from everyone else's)."""

    def __init__(self, client: Any, yields: Yield):
        self._client, self._yields = client, yields

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        self._yields.own += 1
        return self._client.predict(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def counter(url: str) -> Any:
    """Return a reader of the requests the model server at ``url`` (its Prometheus page) has
    answered, every model's; None (with why, on stderr) when the page does not answer: the
    yield then falls back to probes. A reading that fails later reads 0, a change: the job waits
    another window."""
    if scrape(url) is None:
        print(f"batch: no Prometheus page at {url}: yielding by probes", file=sys.stderr)
        return None
    return lambda: float(sum((scrape(url) or {}).values()))


class Runner:
    """Runs parts of one job on one Gateway (its client, caches, tokenizers)."""

    def __init__(self, spec: JobSpec, gateway: Gateway, job: str, models: dict[str, Any]):
        self.spec, self.gateway, self.job, self.models = spec, gateway, job, models
        self.call_rows = spec.call_rows
        self.progress: Progress | None = None  # counts each call's rows as it is answered
        self.refused_calls = 0
        self._probes: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        if spec.yields is not None and spec.yields.count is not None:
            gateway.client = _Counted(gateway.client, spec.yields)  # type: ignore[assignment]

    def _probe(self, name: str, version: int) -> float:
        """Return the seconds of one probe: a one-text Predict of ``name@version``, straight to
        the model server (a failed probe counts as quiet: the call itself meets the failure)."""
        from backend.bucketing import Chunk
        from backend.plan import chunk_inputs

        assert self.spec.yields is not None
        inputs = self._probes.get((name, version))
        if inputs is None:
            tokenizer = self.gateway.assets.get(name, version).tokenizer
            encoded = tokenizer.encode(["probe"])
            chunk = Chunk((0,), int(encoded[0].ids.shape[0]))
            inputs = chunk_inputs(chunk, encoded, tokenizer.pad_id, None)
            self._probes[(name, version)] = inputs
            for _ in range(2):  # a version's first calls of a shape are slow: not the baseline
                self._probe(name, version)
            for _ in range(self.spec.yields.first):  # before any call of the job's: quiet
                self.spec.yields.quiet(self._probe(name, version))
        started = time.monotonic()
        try:
            self.gateway.client.predict(name, inputs, version=version, timeout_s=30)
        except Exception:
            return self.spec.yields.baseline
        return time.monotonic() - started

    def _wait_quiet(self, item: Item) -> None:
        """Wait until the model server is quiet (``JobSpec.yields``); the first probes (the
        quiet time that sizes calls) go first, whichever the rule."""
        if self.spec.yields is None:
            return
        model = self.models[item.spec]
        if (model["model"], model["version"]) not in self._probes:
            self._probe(model["model"], model["version"])
        self.spec.yields.wait(lambda: self._probe(model["model"], model["version"]), time.sleep)

    def run_part(self, items: Sequence[Item]) -> tuple[list[Any], list[dict[str, Any]]]:
        """Return a part's outputs (a table's rows or answer lines) and its error lines."""
        groups: dict[tuple[Any, ...], list[Item]] = {}
        for item in items:
            groups.setdefault(item.options, []).append(item)
        outputs: list[Any] = []
        errors: list[dict[str, Any]] = []
        for group in groups.values():
            start = 0
            while start < len(group):
                rows = self.call_rows
                if self.spec.yields is not None:  # short calls, sized by the yield rule
                    rows = self.spec.yields.rows or min(rows, self.gateway.settings.max_batch_size)
                call = _calls(group[start : start + rows], rows)[0]  # each item >= 1 row
                self._run_call(call, outputs, errors)
                start += len(call)
        return outputs, errors

    def _refused(self, exc: UpstreamError) -> bool:
        """Return True when ``exc`` is the model server's refusal of a call over its batching
        limit and the job's calls now fit it (said once on stderr, counted); False for any other
        refusal (it can't succeed again: the job stops on it)."""
        found = BATCH_LIMIT.search(exc.message)
        settings = self.gateway.settings
        if found is None or not 0 < int(found.group(2)) < settings.max_batch_size:
            return False
        limit = int(found.group(2))
        self.refused_calls += 1
        print(f"batch: the model server refuses calls of more than {limit} rows (its batching "
              f"max_batch_size; --max-batch / GATEWAY_MAX_BATCH is {settings.max_batch_size}): "
              f"calls of {limit} rows from now on; give --max-batch {limit} to skip this "
              "refusal", file=sys.stderr)  # fmt: skip
        self.gateway.settings = replace(settings, max_batch_size=limit)
        return True

    def dims(self, item: Item) -> tuple[int, int]:
        """Return the dense and the multi-vector dimension of ``item``'s model version (its
        model.json's; where that has none, one call's answer): the columns of a part without
        rows."""
        model = self.models[item.spec]
        outputs = self.gateway.assets.get(model["model"], model["version"]).outputs
        dense = outputs.dense.dim if outputs is not None and outputs.dense is not None else 0
        multi = 0
        if outputs is not None and outputs.multivector is not None:
            multi = outputs.multivector.dim
        kinds = self.spec.kinds
        if ("dense" in kinds and not dense) or ("multivector" in kinds and not multi):
            request = EmbedRequest(texts=["dimension"], version=model["version"],
                                   outputs=list(kinds))  # type: ignore[arg-type]  # fmt: skip
            answer = self.gateway.embed(model["model"], request)
            if "dense" in kinds:
                dense = int(np.shape(answer["embeddings"])[-1])
            if "multivector" in kinds:
                multi = int(np.shape(answer["multivectors"][0]["vectors"])[-1])
        return dense, multi

    def _sized(self, took: float, rows: int) -> None:
        """Size the next call by the yield rule (``Yield.size``), when it is on."""
        if self.spec.yields is not None:
            self.spec.yields.size(took, rows, self.call_rows)

    def _run_call(self, call: list[Item], outputs: list[Any], errors: list[dict[str, Any]]) -> None:
        first = call[0]
        by_embed = self.spec.kinds != ("dense",) or (
            first.route == "embed" and first.request.outputs is not None
        )
        try:
            if by_embed:
                self._embed_call(call, outputs)
                return
            done, vectors = self._embeddings(call)
        except GatewayError as exc:
            if exc.status_code >= 500:  # the model server's fault, not a row's: stop the job
                raise
            if len(call) > 1:  # one item's fault: find it by running each alone
                for item in call:
                    self._run_call([item], outputs, errors)
                return
            bad = Bad(call[0].index, call[0].custom_id, exc.status_code,
                      error_body(call[0].route, exc))  # fmt: skip
            errors.append(error_line(self.job, bad))
            if self.progress is not None:  # done too: an error line
                self.progress.add(call[0].count)
            return
        version = int(done.served)
        start = 0
        for item in call:
            end = start + item.count
            if self.spec.fmt == "parquet":
                answer = {"embeddings": vectors[start:end]}
                outputs.extend(self._records(item, answer, version))
            else:
                tokens = int(sum(done.token_counts[start:end]))
                outputs.append(answer_line(self.job, item, vectors[start:end],
                                           done.truncated[start:end], tokens, version))  # fmt: skip
            start = end

    def _records(self, item: Item, answer: dict[str, Any], version: int) -> list[dict[str, Any]]:
        """Return the Parquet records of ``item``'s texts from its slice of an answer."""
        name = self.models[item.spec]["model"]
        records = []
        for k in range(item.count):
            record: dict[str, Any] = {"id": item.custom_id, "input": k, "model": name,
                                      "version": version}  # fmt: skip
            if "dense" in self.spec.kinds:
                record["embedding"] = answer["embeddings"][k]
            if "sparse" in self.spec.kinds:
                record["sparse_indices"] = answer["sparse"][k]["indices"]
                record["sparse_values"] = answer["sparse"][k]["values"]
            if "multivector" in self.spec.kinds:
                record["token_vectors"] = answer["multivectors"][k]["vectors"]
            records.append(record)
        return records

    def _embed_call(self, call: list[Item], outputs: list[Any]) -> None:
        """Run a call through ``Gateway.embed`` (:embed's path: sparse and multi-vector
        outputs) and add each item's records or output line."""
        first = call[0]
        model = self.models[first.spec]
        texts = [text for item in call for text in item.texts]
        req = first.request if first.route == "embed" else EmbedRequest(texts=["-"])
        update: dict[str, Any] = {"texts": texts, "version": model["version"], "label": None}
        if self.spec.fmt == "parquet":
            update["outputs"] = list(self.spec.kinds)
        request = req.model_copy(update=update)
        answer = self._paced(call, lambda: self.gateway.embed(model["model"], request))
        version = int(answer["model"]["version"])
        start = 0
        for item in call:
            end = start + item.count
            part = _slice(answer, start, end)
            if self.spec.fmt == "parquet":
                outputs.extend(self._records(item, part, version))
            else:
                outputs.append(embed_line(self.job, item, part))
            start = end

    def _paced(self, call: list[Item], run: Any, size: Any = None) -> Any:
        """Return ``run()``, retried while the model server is unavailable or slow (then its
        error stops the job), then paced (ops/batch/pacing.py) by ``size(result)``: (rows,
        padded tokens), by default the call's inputs and characters (the pacer needs a size,
        not ids). A refusal is not retried, but one over the batching limit: see ``_refused``."""
        attempt = 0
        while True:
            self._wait_quiet(call[0])
            started = time.monotonic()
            try:
                result = run()
                break
            except (Unavailable, UpstreamTimeout):
                if attempt == self.spec.retries:
                    raise
                time.sleep(min(self.spec.backoff_s * 2.0**attempt, 10.0))
                attempt += 1
            except UpstreamError as exc:
                if not self._refused(exc):
                    raise
        took = time.monotonic() - started
        if self.progress is not None:
            self.progress.add(sum(item.count for item in call))
        if size is None:
            rows, tokens = sum(item.count for item in call), sum(item.size for item in call)
        else:
            rows, tokens = size(result)
        self._sized(took, rows)
        time.sleep(self.spec.pacer.after_call(took, rows, tokens))
        return result

    def _embeddings(self, call: list[Item]) -> tuple[Any, np.ndarray]:
        """Return Gateway.embeddings of the call's inputs, pinned to the resolved version;
        retried on upstream failures, then paced (ops/batch/pacing.py)."""
        first = call[0]
        model = self.models[first.spec]
        texts = [text for item in call for text in item.texts]
        ids = None
        if first.token_ids is not None:
            ids = [row for item in call for row in item.token_ids or []]
        req = first.request
        truncate, normalize = True, None
        if first.route == "openai":
            normalize = True
        elif first.route == "embed":
            truncate, normalize = req.truncate, req.normalize

        def run() -> tuple[Any, np.ndarray]:
            try:
                return self.gateway.embeddings(
                    model["model"], texts, model["version"], None, truncate,
                    normalize=normalize, token_ids=ids,
                    direction=getattr(req, "truncation_direction", None),
                    prompt_name=getattr(req, "prompt_name", None),
                    input_type=getattr(req, "input_type", None),
                )  # fmt: skip
            except ValueError as exc:  # a token id outside the vocabulary
                raise UnprocessableInput(str(exc)) from None

        def size(result: tuple[Any, np.ndarray]) -> tuple[int, int]:
            done, vectors = result
            return len(vectors), sum(len(c.chunk.indices) * c.chunk.seq_len for c in done.calls)

        done, vectors = self._paced(call, run, size)
        return done, vectors


def _slice(answer: dict[str, Any], start: int, end: int) -> dict[str, Any]:
    """Return the part of an :embed answer that belongs to its texts ``start:end``."""
    part: dict[str, Any] = {}
    for key, value in answer.items():
        if key in ("embeddings", "sparse", "multivectors", "truncated"):
            part[key] = value[start:end]
        elif key == "embeddings_by_type":
            part[key] = {kind: vectors[start:end] for kind, vectors in value.items()}
        else:
            part[key] = value
    return part


def _calls(group: list[Item], call_rows: int) -> list[list[Item]]:
    """Return ``group`` cut into calls of at most ``call_rows`` inputs (an item is never cut)."""
    calls: list[list[Item]] = []
    current: list[Item] = []
    rows = 0
    for item in group:
        if current and rows + item.count > call_rows:
            calls.append(current)
            current, rows = [], 0
        current.append(item)
        rows += item.count
    if current:
        calls.append(current)
    return calls


def run_job(spec: JobSpec, settings: Settings, stream: TextIO | None = None) -> Summary:
    """Run (or resume) the job: every part of this shard not yet written; return its summary.
    A failure of the model server (past its retries) raises its GatewayError: the parts written
    so far stay, the one running is not written, and a rerun resumes there."""
    started = time.monotonic()
    spec.output.mkdir(parents=True, exist_ok=True)
    job = digest(spec)
    manifest = parts.read_manifest(spec.output, spec.manifest_name)
    if manifest is not None and manifest["job"] != job:
        raise SystemExit(
            f"{spec.output} holds another job's parts (input or flags differ): use a new --output"
        )
    gateway = Gateway(settings)
    try:
        index, count = spec.shard
        models: dict[str, Any] = dict(manifest["models"]) if manifest else {}
        kinds = spec.kinds if spec.fmt == "parquet" else ("dense",)

        def good(item: Item) -> Bad | None:
            """None for an item to run; its Bad line when its model spec did not resolve."""
            if item.spec not in models:  # resolved once, when the job first sees it
                models.update(resolve_specs(gateway, [item.spec], kinds))
            entry = models[item.spec]
            return None if "version" in entry else _spec_error(item, entry)

        plan = scan(input_lines(spec, settings), good, spec.part_rows,
                    by_spec=spec.form == "batch", keep_bad=index == 0)  # fmt: skip
        mine = [k for k in range(len(plan.parts)) if k % count == index]
        manifest = manifest or {
            "job": job, "input": str(spec.input), "form": spec.form, "models": models,
            "output_format": spec.fmt, "outputs": list(spec.kinds),
            "parts": len(plan.parts), "shard": [index, count],
        }  # fmt: skip
        parts.write_manifest(spec.output, manifest, spec.manifest_name)
        summary = Summary()
        if index == 0:  # the input's bad lines: one file, the first shard's
            lines = [error_line(job, b) for b in sorted(plan.bad, key=lambda b: b.index)]
            parts.write_atomic(spec.output / "input.errors.jsonl", parts.jsonl(lines))
            for b in plan.bad:
                summary.count_error(b.status)
        done = parts.done_parts(spec.output, spec.ext) & set(mine)
        total = sum(plan.rows[k] for k in mine)
        progress = Progress(total, sum(plan.rows[k] for k in done), stream, spec.progress_s)
        runner = Runner(spec, gateway, job, models)
        runner.progress = progress
        todo = [k for k in mine if k not in done]
        progress.start()
        try:
            for window in windows(todo, plan.rows):
                held = load(input_lines(spec, settings), plan, window, good)
                for k in window:
                    _write_part(spec, runner, k, held.pop(k))
        finally:
            summary.refused_calls = runner.refused_calls
            progress.close()
        for k in mine:
            _count_part(spec, k, summary)
        summary.parts = len(mine)
        if spec.yields is not None:
            summary.yielded = {"rule": spec.yields.rule, "probes": spec.yields.probes,
                               "waited_s": round(spec.yields.waited_s, 2),
                               "forced": spec.yields.forced,
                               "quiet_probe_ms": round(spec.yields.baseline * 1000, 2)}  # fmt: skip
        summary.seconds = time.monotonic() - started
        if count == 1:
            _finish(spec, len(plan.parts))
        manifest["summary"] = summary.as_dict()
        manifest["complete"] = True
        parts.write_manifest(spec.output, manifest, spec.manifest_name)
        return summary
    finally:
        gateway.close()


def _write_part(spec: JobSpec, runner: Runner, k: int, items: list[Item]) -> None:
    """Run part ``k`` and write it whole: its errors file, its output file, then its marker
    (the part is done only once all three are in place: parts.done_parts)."""
    outputs, errors = runner.run_part(items)
    out = spec.output
    parts.undo_part(out, k)
    parts.write_atomic(out / parts.part_name(k, parts.ERRORS), parts.jsonl(errors))
    if spec.fmt == "parquet":
        dims = runner.dims(items[0]) if not outputs else (0, 0)
        table = parts.table(outputs, spec.kinds, with_input=spec.form == "batch", dims=dims)
        parts.write_table(out / parts.part_name(k, "parquet"), table)
    else:
        parts.write_atomic(out / parts.part_name(k, "jsonl"), parts.jsonl(outputs))
    parts.mark_done(out, k, len(outputs), len(errors))


def _count_part(spec: JobSpec, k: int, summary: Summary) -> None:
    """Add part ``k``'s rows and error lines (read back from its files) to ``summary``."""
    import orjson
    import pyarrow.parquet as pq

    path = spec.output / parts.part_name(k, spec.ext)
    if spec.fmt == "parquet":
        summary.rows += pq.ParquetFile(path).metadata.num_rows
    else:
        summary.rows += path.read_bytes().count(b"\n")
    for line in (spec.output / parts.part_name(k, "errors.jsonl")).read_bytes().splitlines():
        summary.count_error(orjson.loads(line)["response"]["status_code"])


def _finish(spec: JobSpec, count: int) -> None:
    """One shard: write errors.jsonl (and, for OpenAI Batch output, output.jsonl) from the
    parts."""
    out = spec.output
    errors = [out / "input.errors.jsonl"]
    errors += [out / parts.part_name(k, "errors.jsonl") for k in range(count)]
    parts.concatenate(errors, out / "errors.jsonl")
    if spec.fmt == "openai":
        parts.concatenate([out / parts.part_name(k, "jsonl") for k in range(count)],
                          out / "output.jsonl")  # fmt: skip


def job_settings(args: argparse.Namespace) -> Settings:
    """Return the gateway settings of the job: GATEWAY_* variables, then the flags."""
    overrides: dict[str, Any] = {
        "max_concurrent_chunks": args.concurrency,
        "group_in_flight": 0,  # one caller: nothing to share a call with
        "request_timeout_s": args.timeout,
        "max_request_rows": 1 << 30,  # the job's calls, not a client's request
        "max_request_tokens": 1 << 40,
    }
    if args.max_batch is not None:  # else GATEWAY_MAX_BATCH: the batching limit the stack ships
        overrides["max_batch_size"] = args.max_batch
    if args.tfs:
        overrides["tfs_grpc_target"] = args.tfs
    if args.model_base_path:
        overrides["model_base_path"] = args.model_base_path
    if args.model_config_file:
        overrides["model_config_file"] = args.model_config_file
    return load_settings(overrides)


def parse_kinds(value: str) -> tuple[str, ...]:
    """Return the output kinds of ``dense,sparse,...`` (each once, in modelformat's order)."""
    kinds = [kind.strip() for kind in value.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in KINDS]
    if not kinds or unknown:
        raise argparse.ArgumentTypeError(
            f"--outputs takes kinds of {', '.join(KINDS)}, comma-separated, not {value!r}"
        )
    return tuple(kind for kind in KINDS if kind in kinds)


def parse_shard(value: str) -> tuple[int, int]:
    """Return (i, n) of ``i/n``."""
    index, _, count = value.partition("/")
    if not (index.isdigit() and count.isdigit() and 0 <= int(index) < int(count)):
        raise argparse.ArgumentTypeError(f"--shard takes i/n with 0 <= i < n, not {value!r}")
    return int(index), int(count)


def parser() -> argparse.ArgumentParser:
    """Return the job's command line."""
    p = argparse.ArgumentParser(
        prog="python -m ops.batch",
        description="Embed a corpus with the gateway's stages straight to TF Serving; a killed "
        "job run again resumes (docs/guides/re-embedding.md).",
    )
    p.add_argument("input", type=Path, help="OpenAI Batch JSONL, or JSONL/Parquet rows (--model)")
    p.add_argument("--output", type=Path, required=True, help="folder of parts and manifest")
    p.add_argument("--model", help="rows: the model, name / name@version / name:label "
                   "(resolved once, at the start); without it: OpenAI Batch lines")  # fmt: skip
    p.add_argument("--output-format", choices=("parquet", "openai"), help="parquet (id, the "
                   "--outputs columns, model, version) or openai (OpenAI Batch output and error "
                   "files); default: parquet for rows, openai for OpenAI Batch lines")  # fmt: skip
    p.add_argument("--outputs", type=parse_kinds, default=("dense",), help="Parquet: the output "
                   "kinds, comma-separated: dense, sparse, multivector (default dense); each "
                   "model must have them")  # fmt: skip
    p.add_argument("--id-field", default="id", help="rows: the id's field (default id)")
    p.add_argument("--text-field", default="text", help="rows: the text's field (default text)")
    p.add_argument("--tfs", help="TF Serving gRPC target (default: GATEWAY_TFS_GRPC)")
    p.add_argument("--model-base-path", help="the model tree (default: GATEWAY_MODEL_BASE_PATH)")
    p.add_argument("--model-config-file", help="serving config with the labels "
                   "(default: GATEWAY_MODEL_CONFIG_FILE)")  # fmt: skip
    p.add_argument("--shard", type=parse_shard, default=(0, 1), help="i/n: run part k when "
                   "k %% n == i (Kubernetes: JOB_COMPLETION_INDEX/completions)")  # fmt: skip
    p.add_argument("--part-rows", type=int, default=2048, help="inputs per part file")
    p.add_argument("--call-rows", type=int, default=512, help="inputs per in-process call")
    p.add_argument("--max-batch", type=int, help="rows per model-server call (default: "
                   "GATEWAY_MAX_BATCH, 32, the max_batch_size of serving_config/"
                   "batching_parameters.txt; a call the model server refuses as over its limit "
                   "is sent again at the limit it names, said on stderr)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=2, help="model-server calls in flight")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per call")
    p.add_argument("--slow-ratio", type=float, default=0.0, help="AIMD: halve the duty cycle "
                   "when a call's latency per token is over this x its quiet baseline (e.g. "
                   "1.5; default 0: off, the probes yield)")  # fmt: skip
    p.add_argument("--max-rows-per-s", type=float, default=0.0, help="a cap (0: none)")
    p.add_argument("--yield-ratio", type=float, default=1.2, help="online traffic first (0: "
                   "off); by probes, wait while a probe is over this x its quiet time")  # fmt: skip
    p.add_argument("--yield-on", choices=("requests", "probe"), help="requests: send a call "
                   "only when the model server answered no one else for --quiet-window (its "
                   "request count, --metrics-url); probe: a probe before each call; default: "
                   "requests for one process, probe for --shard i/n (shards would read each "
                   "other's calls as online traffic)")  # fmt: skip
    p.add_argument("--quiet-window", type=float, default=1.0, help="requests: seconds the "
                   "model server must have answered only the job (default 1)")  # fmt: skip
    p.add_argument("--metrics-url", help="the model server's Prometheus page (default: the "
                   "first GATEWAY_TFS_REST + /monitoring/prometheus/metrics)")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; print its summary (JSON) on stdout; 0 when every part was written."""
    import json

    p = parser()
    args = p.parse_args(argv)
    if args.outputs != ("dense",) and args.output_format == "openai":
        p.error("--outputs other than dense need Parquet output (--output-format parquet)")
    if args.outputs != ("dense",) and args.model is None and args.output_format is None:
        p.error("--outputs with OpenAI Batch lines: give --output-format parquet")
    pacer = Pacer(slow_ratio=args.slow_ratio or float("inf"), max_rows_per_s=args.max_rows_per_s)
    spec = JobSpec(
        input=args.input, output=args.output, model=args.model, id_field=args.id_field,
        text_field=args.text_field, part_rows=args.part_rows, call_rows=args.call_rows,
        shard=args.shard, pacer=pacer, output_format=args.output_format, kinds=args.outputs,
    )  # fmt: skip
    settings = job_settings(args)
    if args.yield_ratio > 0:
        spec.yields = Yield(ratio=args.yield_ratio, window_s=args.quiet_window)
        on = args.yield_on or ("requests" if args.shard[1] == 1 else "probe")
        if on == "requests":
            rest = settings.tfs_rest_url.split(",")[0].rstrip("/")
            spec.yields.count = counter(args.metrics_url or rest + METRICS_PATH)
    try:
        summary = run_job(spec, settings)
    except GatewayError as exc:
        print(f"batch: error: {exc.message} (rerun to resume)", file=sys.stderr)
        return 1
    print(json.dumps(summary.as_dict(), sort_keys=True))
    return 0

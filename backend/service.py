"""The gateway's work for one request: resolve the version, tokenize, bucket, call, post-process.

No Flask here; views call these methods and return what they give back.
"""

from __future__ import annotations

import contextvars
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from backend import auth, budget, metrics, routing, timing, tracing
from backend.bucketing import Chunk, plan_chunks, reassemble
from backend.cache import Claim, Entry, Key, ResultCache, SharedTier, entry_of, stack
from backend.clients import PredictClient, make_client, newest_available
from backend.clients.base import Outputs
from backend.early_exit import EXIT_OUTPUT, ignored_note, text_speeds
from backend.embeddings import prompt_for, quantize, with_prompt
from backend.errors import (
    ModelAssetsError,
    ModelNotFound,
    NotFound,
    PayloadTooLarge,
    TaskMismatch,
    TextTooLong,
    UnprocessableInput,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
    VersionNotFound,
)
from backend.grouping import UpstreamGroups
from backend.outputs import (
    KINDS,
    REPLY_NUMBER_BYTES,
    Options,
    dense,
    multivector,
    reply_numbers,
    reply_outputs,
    sparse,
)
from backend.outputs.base import FLOAT_BYTES
from backend.passthrough import Passthrough
from backend.plan import Attempt, Call, Encoder, Plan, chunk_inputs
from backend.postprocessing import classifications, head_scores, l2_normalize, positive_index
from backend.readiness import Readiness
from backend.routing import RoutingTable, routing_file_for
from backend.schemas import ClassifyRequest, EmbedRequest, TagRequest
from backend.settings import Settings
from backend.shadow import ShadowJob, ShadowRunner
from backend.tagging import tag_text, window_stride
from backend.tokenization import Encoded, FirstSegmentTooLong
from backend.versions import (
    AssetCache,
    LabelTable,
    ModelAssets,
    StatusCache,
    VersionResolver,
    check_model_name,
)
from modelformat.outputs import (
    DENSE_OUTPUT,
    TOKEN_VECTORS_OUTPUT,
    TOKEN_WEIGHTS_OUTPUT,
    MultiVectorOutput,
)
from modelformat.outputs import Outputs as ModelOutputs
from modelformat.routing import ModelRoute


class Gateway:
    """Per-process gateway state: the upstream client, caches and the chunk thread pool."""

    def __init__(
        self,
        settings: Settings,
        client: PredictClient | None = None,
        threads: int | None = None,
    ) -> None:
        """``threads``: the worker's request threads, when known (a gunicorn worker's)."""
        self.settings = settings
        self.pid = os.getpid()
        chunk_threads = max(4, settings.max_concurrent_chunks * 4)
        # upstream calls in flight at once: one per request thread, and the chunks' calls
        calls_at_once = threads + chunk_threads if threads else None
        self.client = client if client is not None else make_client(settings, calls_at_once)
        self.assets = AssetCache(settings.model_base_path, recheck_s=settings.status_cache_s)
        self.statuses = StatusCache(
            self._fetch_status, ttl_s=settings.status_cache_s, wait_s=settings.request_timeout_s
        )
        self.labels = LabelTable(settings.model_config_file, recheck_s=settings.labels_cache_s)
        self.resolver = VersionResolver(self.statuses, self.labels)
        self.ready = Readiness(
            self.statuses, self.labels, settings.default_model, self._probe_server,
            settings.retry_after_s,
        )  # fmt: skip
        self.routing = RoutingTable(
            routing_file_for(settings.routing_file, settings.model_config_file),
            recheck_s=settings.labels_cache_s,
        )
        self.shadows = ShadowRunner(settings.shadow_queue_size)
        # shadow calls on model servers of their own (GATEWAY_SHADOW_TFS_*): a gateway of their
        # own there (client, version states, assets), made by the shadow thread on first use
        self._shadow_settings = settings.shadow_settings()
        self._shadow_upstream: Gateway | None = None
        self._passthrough: Passthrough | None = None
        self.groups = (
            UpstreamGroups(settings.max_batch_size, settings.group_in_flight)
            if settings.group_in_flight
            else None
        )
        self._pool = ThreadPoolExecutor(max_workers=chunk_threads, thread_name_prefix="chunk")
        self.cache = _result_cache(settings)

    def close(self) -> None:
        """Stop the pool and close the client (and the shadow target's)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.statuses.close()
        self.client.close()
        if self.cache is not None:
            self.cache.close()
        if self._shadow_upstream is not None:
            self._shadow_upstream.close()

    def passthrough(self) -> Passthrough:
        """Return this worker's state of the /tfs passthrough routes (made on first use)."""
        if self._passthrough is None:
            self._passthrough = Passthrough(self)
        return self._passthrough

    def shadow_upstream(self) -> Gateway:
        """Return the gateway shadow calls go through: this one, or one on the shadow target."""
        if self._shadow_settings is None:
            return self
        if self._shadow_upstream is None:  # only the worker's one shadow thread gets here
            self._shadow_upstream = Gateway(self._shadow_settings)
        return self._shadow_upstream

    # -- the API's operations ---------------------------------------------------------------

    def classify(self, model: str, request: ClassifyRequest) -> dict[str, Any]:
        """Return the :classify answer for ``request``."""

        pairs = request.pairs

        def check(assets: ModelAssets) -> None:
            head = assets.head
            if pairs is not None and not head.text_pair:
                raise TaskMismatch(
                    f"model {model!r} is {head.describe()}: send 'texts', not 'pairs'"
                )
            if pairs is None and head.text_pair:
                raise TaskMismatch(
                    f"model {model!r} is {head.describe()}: send 'pairs' ([text_a, text_b] "
                    "each), not 'texts'"
                )
            if assets.labels and request.top_k > len(assets.labels):
                raise UnprocessableInput(
                    f"top_k {request.top_k} is over the model's {len(assets.labels)} labels"
                )

        inputs: Sequence[str] = request.texts or []
        direction = request.truncation_direction
        plan = Plan(
            model, inputs, request.version, request.label, request.truncate,
            tasks=("classify",), check=check, speed=request.speed,
        )  # fmt: skip
        if pairs is not None:  # pairs are not cached (their texts are two)
            plan.texts = [a for a, _ in pairs]
            plan.what = "pairs"
            plan.encode = _paired([(a, b) for a, b in pairs], direction)
        else:
            plan.encode = _directed(direction)
            if not isinstance(request.speed, list):  # one speed per text: not cached
                plan.reuse = ("classify", direction, request.speed, self.settings.default_speed)
        done = self._infer(plan)
        labels = done.assets.labels
        early_exit = done.assets.early_exit
        with timing.stage("postprocess"):
            predictions = classifications(
                done.outputs, labels, request.top_k, with_logits=request.return_logits,
                head=done.assets.head, with_scores=request.return_scores,
            )  # fmt: skip
            if early_exit is not None:
                self._add_exit_layers(done, predictions)
        for item, cut in zip(predictions, done.truncated, strict=True):
            item["truncated"] = cut
        answer: dict[str, Any] = {"model": self._model_ref(done), "predictions": predictions}
        if request.speed is not None and early_exit is None:
            answer["notes"] = [ignored_note(done.assets.model, done.assets.version)]
        return answer

    @staticmethod
    def _add_exit_layers(done: Plan, predictions: list[dict[str, Any]]) -> None:
        """Give each prediction its ``exit_layer`` and count it in ``gateway_exit_layer``."""
        layers = done.outputs.get(EXIT_OUTPUT)
        if layers is None:
            raise UpstreamError(
                f"model {done.assets.model!r} version {done.assets.version} has early exits "
                f"(model.json) but returned no {EXIT_OUTPUT!r} output"
            )
        histogram = metrics.child(metrics.EXIT_LAYER, done.assets.model, str(done.assets.version))
        for item, layer in zip(predictions, layers.tolist(), strict=True):
            item["exit_layer"] = layer
            histogram.observe(layer)

    def embed(self, model: str, request: EmbedRequest) -> dict[str, Any]:
        """Return the :embed answer for ``request``: the output kinds asked (dense vectors as a
        float32 array, and as each of ``embedding_types``; sparse vectors; multi-vectors)."""
        options = embed_options(request)
        plan = Plan(model, request.texts, request.version, request.label, request.truncate,
                    options=options)  # fmt: skip
        if request.long_text != "chunk":  # a chunked text's windows are not cached
            plan.reuse = ("embed", request.prompt_name, request.input_type,
                          request.truncation_direction, options.is_query)  # fmt: skip
        plan.encode = self._embed_encoder(plan, request)
        done = self._infer(plan)
        with timing.stage("postprocess"):
            answer = self._embed_answer(done, request)
        types = request.embedding_types
        if types is not None and "embeddings" in answer:
            answer["embeddings_by_type"] = typed_embeddings(answer["embeddings"], types)
            if "float" not in types:
                del answer["embeddings"]
        dense.encode_answer(answer, options.encoding)
        return answer

    def _embed_encoder(self, plan: Plan, request: EmbedRequest) -> Encoder:
        """Return :embed's encoder: the prompted texts (in windows with long_text=chunk, each
        window's input in ``plan.owners``), cut and marked as the model's query or document
        side (ColBERT: backend/outputs/multivector.py)."""
        chunked = request.long_text == "chunk"
        is_query = plan.options is not None and plan.options.is_query

        def encode(plan: Plan) -> list[Encoded]:
            assets = plan.assets
            texts = with_prompt(plan.texts, _prompt(assets, request.prompt_name,
                                                       request.input_type))  # fmt: skip
            spec = assets.outputs.multivector if assets.outputs is not None else None
            side = multivector.side_of(spec, is_query) if spec is not None else None
            most = multivector.max_tokens(side, assets.max_seq_len)
            tokenizer = assets.tokenizer
            if chunked:
                owners: list[int] = []
                encoded = []
                for index, windows in enumerate(tokenizer.windows(texts, max_len=most)):
                    owners.extend([index] * len(windows))
                    encoded.extend(windows)
                plan.owners = owners
            else:
                encoded = tokenizer.encode(texts, direction=request.truncation_direction,
                                           max_len=most)  # fmt: skip
            if side is None:
                return encoded
            marked = multivector.mark(encoded, side, is_query)
            extra = sum(
                m.ids.shape[0] - e.ids.shape[0] for m, e in zip(marked, encoded, strict=True)
            )
            budget.spend(0, extra)  # the markers and a query's expansions are tokens too
            return marked

        return encode

    def _embed_answer(self, done: Plan, request: EmbedRequest) -> dict[str, Any]:
        """Return the :embed answer of a finished plan: each kind asked, post-processed by its
        module (backend/outputs/); windows merged per text."""
        options = done.options or Options()
        spec = done.assets.outputs or ModelOutputs()
        owners, texts = done.owners, len(request.texts)
        answer: dict[str, Any] = {"model": self._model_ref(done)}
        if "dense" in done.kinds:
            vectors = self._output(done, DENSE_OUTPUT)
            normalize = request.normalize
            if normalize is None:
                normalize = done.assets.embedding.normalize_by_default
            if owners is None:
                pooled = dense.vectors(vectors, normalize)
            else:  # each window's unit vector, weighted by its tokens
                specials = done.assets.tokenizer.layout.single_specials
                weights = np.asarray(done.token_counts, dtype=np.float32) - float(specials)
                pooled = dense.pool(dense.vectors(vectors, True), owners, weights, texts)
                pooled = dense.vectors(pooled, normalize)
            answer["embeddings"] = pooled
            answer["dim"] = int(pooled.shape[-1])
        if "sparse" in done.kinds and spec.sparse is not None:
            rows = [e.ids for e in done.encoded]
            idf = done.assets.sparse_idf
            if done.from_idf and idf is not None:
                found = sparse.from_idf(rows, idf)
            else:
                try:
                    found = sparse.extract(spec.sparse, done.outputs, rows)
                except KeyError as exc:
                    raise UpstreamError(f"the model returned no {exc.args[0]!r} output") from None
            if owners is not None:
                found = sparse.merge(found, owners, texts)
            tokenizer = done.assets.tokenizer
            answer["sparse"] = []
            for vector in found:
                vector = sparse.limit(vector, options.top_k, options.min_weight)
                words = tokenizer.vocab_tokens(vector.indices.tolist()) if options.with_tokens \
                    else None  # fmt: skip
                answer["sparse"].append(sparse.answer(vector, words))
        if "multivector" in done.kinds and spec.multivector is not None:
            try:
                matrices = multivector.extract(spec.multivector, done.outputs, done.encoded,
                                               [options.is_query] * len(done.encoded))  # fmt: skip
            except KeyError as exc:
                raise UpstreamError(f"the model returned no {exc.args[0]!r} output") from None
            if owners is not None:
                matrices = multivector.merge(matrices, owners, texts)
            try:
                answer["multivectors"] = [multivector.answer(m, options.types, quantize,
                                                             options.encoding)
                                          for m in matrices]  # fmt: skip
            except ValueError as exc:
                raise UnprocessableInput(str(exc)) from None
            answer["multivector_dim"] = int(done.outputs[TOKEN_VECTORS_OUTPUT].shape[-1])
        if owners is None:
            answer["truncated"] = done.truncated
        else:
            answer["truncated"] = [False] * texts
            answer["windows"] = np.bincount(owners, minlength=texts).tolist()
        return answer

    @staticmethod
    def _output(done: Plan, name: str) -> np.ndarray:
        """Return the model's output ``name``; 502 when it returned none."""
        value = done.outputs.get(name)
        if value is None:
            raise UpstreamError(f"the model returned no {name!r} output")
        return value

    def embeddings(
        self,
        model: str,
        texts: Sequence[str],
        version: int | None,
        label: str | None,
        truncate: bool = True,
        *,
        normalize: bool | None = None,
        token_ids: Sequence[Sequence[int]] | None = None,
        direction: str | None = None,
        encode: Encoder | None = None,
        prompt_name: str | None = None,
        input_type: str | None = None,
        types: Sequence[str] = ("float",),
        encoding: str = "float",
    ) -> tuple[Plan, np.ndarray]:
        """Return the inference and its embeddings, float32 ``[texts, dim]``: the one path every
        dense-only embedding route takes (/v1/embeddings, /v2/embed, batch jobs). ``token_ids``
        (instead of texts) are the tokens of each input without special tokens, which the
        gateway adds. The texts get the model's prompt (``prompt_name``, Cohere's
        ``input_type``, else its default prompt: backend/embeddings.py); ``normalize`` None: the
        model's own choice. Only the dense output is asked of the model server (a BGE-M3
        export's token outputs stay there), and the answer in ``types`` and ``encoding`` is
        counted against GATEWAY_MAX_ANSWER_BYTES before the call."""
        if token_ids is not None:
            if prompt_name is not None or input_type is not None:
                raise UnprocessableInput("prompt_name and input_type need texts, not token ids")

            def encode(plan: Plan) -> list[Encoded]:
                plan.characters = 0  # the caller sent tokens, not text
                return plan.assets.tokenizer.encode_ids(token_ids)

            texts = [""] * len(token_ids)  # an input each (errors name input[i])
        if encode is None:

            def encode(plan: Plan) -> list[Encoded]:
                prompted = with_prompt(plan.texts, _prompt(plan.assets, prompt_name, input_type))
                return plan.assets.tokenizer.encode(prompted, direction=direction)

        dense_only = Options(kinds=("dense",), types=tuple(types), encoding=encoding)
        done = self._infer(Plan(model, texts, version, label, truncate, encode=encode,
                                check=_dense_only(model), options=dense_only))  # fmt: skip
        with timing.stage("postprocess"):
            embeddings = done.outputs.get("embedding")
            if embeddings is None:
                raise UpstreamError("the model returned no 'embedding' output")
            if normalize is None:
                normalize = done.assets.embedding.normalize_by_default
            if normalize:
                embeddings = l2_normalize(embeddings)
            return done, np.ascontiguousarray(embeddings, dtype=np.float32)

    def tag(self, model: str, request: TagRequest) -> dict[str, Any]:
        """Return the :tag answer: each text's entities with character offsets into it."""
        cut = request.long_text == "truncate"

        def encode(plan: Plan) -> list[Encoded]:
            assets = plan.assets
            stride = window_stride(assets.max_seq_len)
            budget.expect(len(plan.texts))  # a row each at least, before any is tokenized
            plan.windows = [assets.tokenizer.tag_windows(text, stride, truncate=cut)
                            for text in plan.texts]  # fmt: skip
            return [window.encoded for text_windows in plan.windows for window in text_windows]

        done = self._infer(Plan(
            model, request.texts, request.version, request.label, tasks=("tag",),
            encode=encode, per_token=True,
        ))  # fmt: skip
        with timing.stage("postprocess"):
            values = done.outputs.get("logits")
            probabilities = values is None
            if values is None:
                values = done.outputs.get("probabilities")
            if values is None or values.ndim != 3:
                raise UpstreamError(
                    f"model {model!r} is a tag model but returned no per-token 'logits' "
                    f"[batch, seq, labels] (outputs: {sorted(done.outputs)})"
                )
            names = list(done.assets.labels)
            if len(names) != values.shape[-1]:
                names = [str(i) for i in range(values.shape[-1])]
            predictions, row = [], 0
            for text, text_windows in zip(request.texts, done.windows or [], strict=True):
                budget.past_deadline(done.deadline)
                rows = [values[row + k, : w.encoded.ids.shape[0]] for k, w in
                        enumerate(text_windows)]  # fmt: skip
                row += len(text_windows)
                entities = tag_text(
                    text, text_windows, rows, request.aggregation, names,
                    done.assets.tokenizer.unk_id, probabilities=probabilities,
                    word_aware=done.assets.tokenizer.word_aware,
                )  # fmt: skip
                cut_text = text_windows[0].encoded.truncated
                predictions.append(
                    {"entities": entities, "truncated": cut_text, "windows": len(text_windows)}
                )
        return {"model": self._model_ref(done), "aggregation": request.aggregation,
                "predictions": predictions}  # fmt: skip

    def rerank(
        self,
        model: str,
        query: str,
        documents: Sequence[str],
        version: int | None,
        label: str | None,
        direction: str | None = None,
        weights: Sequence[float] | None = None,
    ) -> tuple[Plan, np.ndarray]:
        """Return the inference and each document's relevance score (float32, documents'
        order), all inputs in one inference: an embedding model's (1 + cosine) / 2 with the
        query; a multi-vector model's MaxSim (ColBERT: the query and documents each on their
        side; ``weights`` [dense, sparse, colbert] on a model with all three: FlagEmbedding's
        weighted sum); a sparse-only model's lexical match; or a cross-encoder's score of
        each (query, document) pair."""

        def check(assets: ModelAssets) -> None:
            if assets.task == "classify":
                if not assets.head.text_pair:
                    raise TaskMismatch(
                        f"model {model!r} is {assets.head.describe()}: rerank takes an "
                        "embedding model or a cross-encoder (a sentence-pair model)"
                    )
                _positive(model, assets)
            outputs = assets.outputs
            if weights is not None and (outputs is None or len(outputs.kinds) < 3):
                kinds = ", ".join(outputs.kinds) if outputs is not None else "classify"
                raise UnprocessableInput(
                    f"field 'weights': model {model!r} has not dense, sparse and multi-vector "
                    f"outputs to weigh (its outputs: {kinds})"
                )

        def encode(plan: Plan) -> list[Encoded]:
            assets = plan.assets
            spec = assets.outputs.multivector if assets.outputs is not None else None
            if spec is not None and spec.query is not None and spec.document is not None:
                return _colbert_sides(assets, spec, query, documents, direction)
            if assets.task == "embed":  # the model's query and document prompts, if any
                ask = give = ""
                if assets.embedding.include_prompt:
                    ask = _prompt(assets, None, "search_query")
                    give = _prompt(assets, None, "search_document")
                texts = [ask + query, *with_prompt(documents, give)]
                return assets.tokenizer.encode(texts, direction=direction)
            # a cross-encoder reads the query again beside each document
            plan.characters = len(query) * len(documents) + sum(map(len, documents))
            try:
                return assets.tokenizer.encode_pairs([(query, d) for d in documents], direction)
            except FirstSegmentTooLong as exc:
                raise TextTooLong(
                    f"the query alone fills max_seq_len {assets.max_seq_len} of model "
                    f"{model!r}: nothing of a document would fit; shorten it"
                ) from exc

        done = self._infer(Plan(
            model, [query, *documents], version, label, tasks=("embed", "classify"),
            check=check, encode=encode,
        ))  # fmt: skip
        with timing.stage("postprocess"):
            if done.assets.task == "classify":
                scores = head_scores(done.outputs, done.assets.head.activation)
                return done, scores[:, _positive(model, done.assets)].astype(np.float32)
            outputs = done.assets.outputs
            if outputs is not None and (outputs.multivector is not None or outputs.dense is None):
                return done, _retrieval_scores(done, outputs, weights)
            vectors = done.outputs.get("embedding")
            if vectors is None:
                raise UpstreamError("the model returned no 'embedding' output")
            vectors = l2_normalize(vectors)
            cosine = np.clip(vectors[1:] @ vectors[0], -1.0, 1.0)  # unit vectors, up to rounding
            return done, ((1.0 + cosine) / 2.0).astype(np.float32)

    def tokenize(
        self, model: str, texts: Sequence[str], version: int | None, label: str | None
    ) -> tuple[ModelAssets, list[dict[str, Any]]]:
        """Return the assets of the version that would serve, and each text's tokens with their
        character offsets in the text (no call to the model server beyond version resolution)."""
        assets = self._assets_for(model, version, label)
        with budget.scope(self.settings, time.monotonic() + self._timeout()):
            return assets, assets.tokenizer.describe(texts)

    def detokenize(
        self, model: str, ids: Sequence[Sequence[int]], version: int | None, label: str | None
    ) -> tuple[ModelAssets, list[dict[str, Any]]]:
        """Return the assets of the version that would serve, and each id list's text."""
        assets = self._assets_for(model, version, label)
        with budget.scope(self.settings, time.monotonic() + self._timeout()):
            return assets, assets.tokenizer.decode(ids)

    def _assets_for(self, model: str, version: int | None, label: str | None) -> ModelAssets:
        """Return the assets of the version an inference request naming ``version`` or
        ``label`` (or neither: the routing file's weights) would be served by: stage resolve
        alone, with the inference routes' retries."""
        plan = Plan(model, (), version, label, tasks=None)
        self._attempts(plan, self._resolve_stage)
        return plan.assets

    def model_status(self, model: str) -> dict[str, Any]:
        """Return the model's versions and states (from the model server) and its labels."""
        check_model_name(model)
        # Asked now, and kept: the requests after it use this answer rather than fanning out
        # again (a flood of this route must not turn every default request into a fan-out).
        statuses = self.statuses.get(model, fresh=True)
        return {
            "model": model,
            "versions": [
                {
                    "version": s.version,
                    "state": s.state,
                    "error_code": s.error_code,
                    "error_message": s.error_message,
                }
                for s in statuses
            ],
            "labels": self.labels.labels(model),
            "default_version": newest_available(statuses),
        }

    def readiness(self) -> dict[str, Any]:
        """Return the ready answer, or raise 503 (``backend.readiness`` says when)."""
        return self.ready.check()

    def _probe_server(self) -> list[Any]:
        """Ask the model server anything: an answer, even a 404, means it is up."""
        try:
            return self.client.model_status("readiness-probe", timeout_s=min(2.0, self._timeout()))
        except (NotFound, UpstreamError):
            return []

    # -- the pipeline: the named stages a Plan crosses (backend/plan.py) -------------------

    def _infer(self, plan: Plan) -> Plan:
        """Run ``plan`` through resolve, tokenize, plan, call and reassemble, in order, again
        on the next version to try when the one resolved is not served (at most twice more);
        the route post-processes what it returns."""
        self._attempts(plan, self._stages)
        if plan.route is not None:
            self._plan_shadow(plan.route, plan)
        return plan

    def _attempts(self, plan: Plan, stages: Callable[[Plan], None]) -> None:
        """Start the request's clock (its deadline, once) and budget, and run ``stages`` on
        it, again on the next version to try while the one resolved is not served."""
        plan.deadline = time.monotonic() + self._timeout()
        # one budget for the request: an attempt on the next version spends from the same
        with budget.scope(self.settings, plan.deadline):
            while True:
                try:
                    stages(plan)
                    return
                except NotFound as exc:
                    plan.attempt = self._next_attempt(plan, exc)

    def _next_attempt(self, plan: Plan, exc: NotFound) -> Attempt:
        """Return the attempt after ``exc`` (plan.attempt's version was not served); re-raise
        ``exc`` when there is none to make."""
        tried = plan.attempt
        if not tried.reached or tried.choice is None:
            raise exc  # from before the key's reach was checked: nothing to try again
        version, label = tried.choice
        after = Attempt(reached=True, refreshed=tried.refreshed, number=tried.number + 1)
        if tried.weighted:
            # The weights name a version that is not (or no longer) served here: the request
            # goes to the vetted version (the first public label the model has), never to the
            # newest AVAILABLE one (in a pinned rollout: the unvetted version).
            after.choice = (None, self._fallback_label(plan.model))
            return after
        if isinstance(exc, VersionNotFound) and version is None and not tried.refreshed:
            # The label or newest version we resolved was unloaded since we cached it (a
            # rollback moves the label and drops the old version in one config change): read
            # labels and states afresh and try once more. A version the caller named: their 404.
            self.labels.refresh()
            self.statuses.invalidate(plan.model)
            after.choice, after.refreshed = (None, label), True
            return after
        raise exc

    def _resolve_stage(self, plan: Plan) -> None:
        """Stage ``resolve`` alone (``:tokenize``, ``:detokenize``): the version the same request
        to an inference route would get."""
        with timing.stage("resolve"):
            self._resolve(plan)

    def _stages(self, plan: Plan) -> None:
        """The stages from resolve to reassemble, each timed under its name (backend/timing.py)."""
        with timing.stage("resolve"):
            self._resolve(plan)
        cache = self.cache
        if cache is not None and plan.reuse is not None and _cacheable(plan):
            self._cached_stages(plan, cache)
            return
        with timing.stage("cache"):  # nothing to look up: every inference crosses the stages
            pass
        self._compute(plan)

    def _compute(self, plan: Plan) -> None:
        """The stages from tokenize to reassemble, each timed under its name."""
        # the tokenizer spends from the request's budget as it goes (backend/budget.py): the
        # request's own (``_infer``), or a fresh one for a shadow's plan
        with timing.stage("tokenize"), budget.scope(self.settings, plan.deadline):
            encode = plan.encode
            plan.encoded = (
                encode(plan) if encode is not None else plan.assets.tokenizer.encode(plan.texts)
            )  # fmt: skip
            if plan.options is not None:  # every kind, dense (texts x dim) too
                self._check_answer_bytes(plan)
        if plan.from_idf:  # inference-free sparse queries: postprocess reads the IDF table
            _check_truncation(plan)
            plan.calls, plan.results, plan.outputs = [], [], {}
            return
        with timing.stage("plan"):
            self._plan(plan)
        with timing.stage("call"):
            plan.results = self._call(plan)
        with timing.stage("reassemble"):
            chunks = [c.chunk for c in plan.calls]
            plan.outputs = reassemble(
                chunks, plan.results, len(plan.encoded), per_token=plan.per_token,
                token_outputs=(TOKEN_WEIGHTS_OUTPUT, TOKEN_VECTORS_OUTPUT),
            )  # fmt: skip

    def _cached_stages(self, plan: Plan, cache: ResultCache) -> None:
        """Stage ``cache``, then tokenize to reassemble on the misses only: each text's tokens
        and model rows from the cache or from the model, in the caller's order (the route
        post-processes them as it would uncached ones). Concurrent misses of one text are
        computed once; ``Cache-Control: no-store`` computes every text and keeps none."""
        clock = timing.current()
        if clock is not None and clock.no_store:
            with timing.stage("cache"):
                clock.cache = "bypass"
            self._compute(plan)
            return
        claim = Claim()
        try:  # from the lookup on: a claim left behind makes its text's waiters wait it out
            with timing.stage("cache"):
                keys = self._cache_keys(plan)
                found, mine, theirs = cache.lookup(keys, claim)
                if cache.shared is not None and mine:
                    asked = len(mine)
                    mine = cache.fill(keys, found, mine, claim)
                    if clock is not None:
                        clock.cache_shared = _tier_answer(asked, asked - len(mine),
                                                          cache.shared.degraded)  # fmt: skip
            if clock is not None:
                hits = len(keys) - len(mine) - len(theirs)
                clock.cache = "hit" if hits == len(keys) else "miss" if not hits else "partial"
            if mine:
                self._compute_texts(plan, mine, keys, found, cache)
        finally:
            cache.release(claim)  # before waiting on theirs: theirs may wait on ours
        if theirs:
            left = []
            with timing.stage("cache"):
                for index, flight in theirs:
                    flight.wait(max(0.0, plan.deadline - time.monotonic()))
                    found[index] = cache.get(keys[index])
                    if found[index] is None:  # theirs failed, or was too big to keep
                        left.append(index)
            if left:
                self._compute_texts(plan, left, keys, found, cache)
        entries = [entry for entry in found if entry is not None]
        plan.encoded = [entry.encoded for entry in entries]
        plan.outputs = stack(entries)
        _check_truncation(plan)  # a hit cut under truncate=true is a 413 under false
        if plan.options is not None:
            self._check_answer_bytes(plan)

    def _cache_keys(self, plan: Plan) -> list[Key]:
        """Return each text's key: everything its entry depends on (scope, model, served
        version, the route's inputs, the outputs the model-server call is narrowed to, text)."""
        scope = ""
        key = auth.current_key.get()
        if key is not None and not self.settings.cache_shared_keys:
            scope = key.name
        held = _wanted_outputs(plan) or "every output"  # what _call_one asks for
        head = (scope, plan.model, plan.served, plan.reuse, held)
        return [(*head, text) for text in plan.texts]

    def _compute_texts(
        self,
        plan: Plan,
        indices: list[int],
        keys: Sequence[Key],
        found: list[Entry | None],
        cache: ResultCache,
    ) -> None:
        """Run tokenize to reassemble on the texts at ``indices`` only; put each one's entry in
        ``found`` and in the cache."""
        texts = plan.texts
        plan.texts = [texts[i] for i in indices]
        plan.positions = indices
        try:
            self._compute(plan)
        finally:
            plan.texts, plan.positions = texts, None
        outputs = plan.outputs
        computed = []
        for row, index in enumerate(indices):
            entry = entry_of(keys[index], plan.encoded[row],
                             {name: value[row] for name, value in outputs.items()})  # fmt: skip
            found[index] = entry
            computed.append((keys[index], entry))
        cache.keep(computed)

    def _resolve(self, plan: Plan) -> None:
        """Stage ``resolve``: the first time (no choice in ``plan.attempt``) the key's reach
        and the routing file's pick for default traffic, then the version that serves and its
        assets; 403/404/409/422 for a version or task the request can't have."""
        model, attempt = plan.model, plan.attempt
        if attempt.choice is None:
            plan.route = None
            self._check_reach(model, plan.version, plan.label)
            attempt.reached = True
            # Default traffic (no version, no label) follows the routing file's weights and
            # shadow.
            default = plan.version is None and plan.label is None
            plan.route = self.routing.route(model) if default else None
            attempt.weighted = plan.route is not None and bool(plan.route.weights)
            if plan.route is not None and attempt.weighted:
                attempt.choice = (self.routing.choose(model, plan.route), None)
            else:
                attempt.choice = (plan.version, plan.label)
        version, label = attempt.choice
        served = self._upstream_call(lambda: self.resolver.resolve(model, version, label))
        try:
            assets = self.assets.get(model, served)
        except NotFound as exc:
            if version is not None or label is not None:
                raise  # the caller named a version that does not exist
            # The model server serves it, but our copy of the model tree lacks it: a deployment
            # error (GATEWAY_MODEL_BASE_PATH not the model server's volume), not the caller's.
            raise ModelAssetsError(
                f"model {model!r} version {served} is AVAILABLE on the model server but not "
                f"under GATEWAY_MODEL_BASE_PATH={self.settings.model_base_path}"
            ) from exc
        # Only now is it a version the model tree has (the client's ``version`` is any number
        # until its assets load): the request's metrics may name it from here on.
        routing.resolved_version.set((model, served))
        if plan.tasks is not None and assets.task not in plan.tasks:
            wanted = " or ".join(repr(t) for t in plan.tasks)
            raise TaskMismatch(
                f"model {model!r} is {assets.head.describe()} (task {assets.task!r}), not {wanted}"
            )
        if plan.check is not None:
            plan.check(assets)
        if plan.options is not None and assets.outputs is not None:
            plan.kinds = answered_kinds(model, assets.outputs, plan.options)
            plan.from_idf = (
                plan.options.is_query and plan.kinds == ("sparse",)
                and assets.sparse_idf is not None
            )  # fmt: skip
        plan.served, plan.assets = served, assets

    def _check_answer_bytes(self, plan: Plan) -> None:
        """413 when the answer the plan's kinds make of its tokenized rows would be over
        GATEWAY_MAX_ANSWER_BYTES (each kind's estimate: backend/outputs/), before any call."""
        outputs, options = plan.assets.outputs, plan.options
        if outputs is None or options is None:
            return
        lengths = [e.ids.shape[0] for e in plan.encoded]
        plan.answer_bytes = sum(
            KINDS[kind].answer_bytes(getattr(outputs, kind), lengths, options)
            for kind in plan.kinds
        )
        most = self.settings.max_answer_bytes
        if plan.answer_bytes > most:
            raise PayloadTooLarge(
                f"the answer would take about {plan.answer_bytes} bytes ({', '.join(plan.kinds)} "
                f"of {len(lengths)} rows, {sum(lengths)} tokens), over the limit of {most} "
                "(GATEWAY_MAX_ANSWER_BYTES): send fewer or shorter texts, fewer outputs, or "
                "int8/binary embedding_types"
            )

    def _plan(self, plan: Plan) -> None:
        """Stage ``plan``: each input's speed, the chunks and their tensors; 413 for a text over
        max_seq_len that may not be cut."""
        assets, encoded = plan.assets, plan.encoded
        plan.speeds = None
        if assets.early_exit is not None:
            try:
                plan.speeds = text_speeds(
                    plan.speed, self.settings.default_speed, assets.early_exit, len(encoded)
                )
            except ValueError as exc:
                raise UnprocessableInput(f"field 'speed': {exc}") from None
        _check_truncation(plan)
        lengths = [e.ids.shape[0] for e in encoded]
        tokens = sum(lengths)
        metrics.TEXTS_PER_REQUEST.observe(len(encoded))
        metrics.TOKENS_PER_REQUEST.observe(tokens)
        characters = plan.characters
        timing.count(tokens, sum(map(len, plan.texts)) if characters is None else characters)
        bucketing = self.settings.bucketing
        chunks = plan_chunks(
            lengths, self.settings.max_batch_size, assets.max_seq_len, bucketing=bucketing,
            bucket_lens=sorted(assets.bucket_signatures) or None,
        )  # fmt: skip
        # A bucket-padded chunk goes to its length's fixed-length signature: TF Serving batches
        # per signature, so each queue then holds one shape and never pads (padding is off).
        by_length = assets.bucket_signatures if bucketing else {}
        pad_id = assets.tokenizer.pad_id
        self._check_reply_bytes(plan, chunks)
        plan.calls = [
            Call(chunk, chunk_inputs(chunk, encoded, pad_id, plan.speeds),
                 by_length.get(chunk.seq_len))
            for chunk in chunks
        ]  # fmt: skip

    def _check_reply_bytes(self, plan: Plan, chunks: Sequence[Chunk]) -> None:
        """413 when the model server's replies to an embedder's ``chunks`` would take more than
        GATEWAY_MAX_ANSWER_BYTES, before any call: each chunk's rows x the numbers of the outputs
        the call brings back (those asked, or every one where the transport can't narrow:
        backend/outputs/ ``reply_outputs``) x a number's bytes on that transport."""
        outputs = plan.assets.outputs
        if outputs is None:  # classify and tag: their replies are their answers' size
            return
        transport = self.client.transport
        names = reply_outputs(outputs, _wanted_outputs(plan), transport,
                              plan.assets.info.get("kind_signatures"))  # fmt: skip
        each = REPLY_NUMBER_BYTES.get(transport, FLOAT_BYTES)
        total = sum(len(c.indices) * reply_numbers(outputs, names, c.seq_len) * each
                    for c in chunks)  # fmt: skip
        most = self.settings.max_answer_bytes
        if total > most:
            rows, tokens = sum(len(c.indices) for c in chunks), max(c.seq_len for c in chunks)
            raise PayloadTooLarge(
                f"the model server's reply would take about {total} bytes ({', '.join(names)} "
                f"of {rows} rows of up to {tokens} tokens over {transport}), over the limit of "
                f"{most} (GATEWAY_MAX_ANSWER_BYTES): send fewer or shorter texts or fewer outputs"
            )

    def _call(self, plan: Plan) -> list[Outputs]:
        """Stage ``call``: each call's outputs (the plan's order), at most N calls in flight."""
        if len(plan.calls) == 1 and self.client.enforces_deadline:
            return [self._call_one(plan, plan.calls[0])]  # the common case: no thread hop
        return self._run_parallel(lambda call: self._call_one(plan, call), plan.calls,
                                  plan.deadline)  # fmt: skip

    def _call_one(self, plan: Plan, call: Call) -> Outputs:
        """One chunk's outputs from the model server (alone, or in a call shared with
        concurrent requests of its kind: backend/grouping.py)."""
        model, version, signature = plan.model, plan.served, call.signature
        remaining = plan.deadline - time.monotonic()
        if remaining <= 0:
            raise UpstreamTimeout("the request ran past GATEWAY_TIMEOUT_S")

        wanted = _wanted_outputs(plan)
        only: dict[str, Any] = {"output_filter": wanted} if wanted else {}

        def send(inputs: Any, timeout_s: float) -> tuple[Outputs, int]:
            rows = int(next(iter(inputs.values())).shape[0])
            with tracing.upstream_call(model, version, signature, rows, self.client.transport):
                return self._upstream_call(
                    lambda: self.client.predict(
                        model, inputs, version=version, timeout_s=timeout_s,
                        signature_name=signature, **only,
                    )
                )  # fmt: skip

        inputs = call.inputs
        if self.groups is None:
            outputs, served = send(inputs, remaining)
        else:
            kind = (model, version, signature, call.chunk.seq_len, tuple(sorted(inputs)), wanted)
            outputs, served = self.groups.call(kind, inputs, send, plan.deadline, model=model)
        if served not in (version, -1):
            # Never return answers from a version other than the one we tokenized for.
            raise UpstreamError(f"asked for version {version}, the model server used {served}")
        return outputs

    def _check_reach(self, model: str, version: int | None, label: str | None) -> None:
        """403 when the request's API key may not name ``version``/``label`` (backend/auth.py);
        marks the request pinned (kept out of the series rollouts decide on) when it names one."""
        if version is None and label is None:
            return
        routing.pinned.set(True)
        key = auth.current_key.get()
        if key is not None:
            public = self.settings.public_label_names
            auth.check_reach(key, model, version, label, self.labels.labels(model), public)

    def _fallback_label(self, model: str) -> str | None:
        """Return the first public label ``model`` has (None: it has none, nothing is vetted)."""
        labels = self.labels.labels(model)
        return next((name for name in self.settings.public_label_names if name in labels), None)

    def _plan_shadow(self, route: ModelRoute, done: Plan) -> None:
        """Leave a shadow job for the app to queue once the client's answer is built: the same
        request as a fresh plan on the shadow version (on its own model server, if set)."""
        served = done.served
        shadow = self.routing.shadow_for(route, served)
        if shadow is None:
            return
        model = done.model

        def run() -> tuple[Sequence[str], dict[str, np.ndarray]]:
            again = replace(done, version=shadow, label=None, check=None, reuse=None)
            upstream = self.shadow_upstream()
            again.deadline = time.monotonic() + self.settings.shadow_timeout_s
            again.attempt = Attempt(choice=(shadow, None), reached=True)
            upstream._stages(again)
            return again.assets.labels, again.outputs

        routing.pending_shadow.set(ShadowJob(
            model=model, task=done.assets.task, served_version=served, shadow_version=shadow,
            labels=done.assets.labels, outputs=done.outputs,
            run=tracing.linked("gateway.shadow", run, {
                "gateway.model": model, "gateway.version": served, "gateway.shadow_version": shadow,
            }),
        ))  # fmt: skip

    def _run_parallel(
        self, send: Callable[[Call], Outputs], calls: Sequence[Call], deadline: float
    ) -> list[Outputs]:
        results: list[Outputs | None] = [None] * len(calls)
        pending: dict[Future[Outputs], int] = {}
        queue = list(enumerate(calls))
        limit = self.settings.max_concurrent_chunks
        try:
            while queue or pending:
                while queue and len(pending) < limit:
                    index, call = queue.pop(0)
                    # in the request's context: its clock and span follow the chunk's call
                    context = contextvars.copy_context()
                    pending[self._pool.submit(context.run, send, call)] = index
                remaining = deadline - time.monotonic()
                done, _ = wait(pending, timeout=max(0.0, remaining), return_when=FIRST_COMPLETED)
                if not done:
                    raise UpstreamTimeout(
                        f"the model server did not answer within {self._timeout():.3g}s"
                    )
                for future in done:
                    results[pending.pop(future)] = future.result()  # re-raises a chunk's error
        finally:
            for future in pending:
                future.cancel()
        return [r for r in results if r is not None]

    def _upstream_call(self, fn: Any) -> Any:
        """Run ``fn`` and count the gateway errors it raises by code."""
        try:
            return fn()
        except (UpstreamUnavailable, UpstreamTimeout, UpstreamError) as exc:
            metrics.child(metrics.UPSTREAM_ERRORS, self.client.transport, exc.code).inc()
            raise

    def _fetch_status(self, model: str) -> list[Any]:
        # A model the gateway has no directory for can't be served (its assets are read from
        # there): a 404 without asking every replica (and StatusCache remembers it briefly).
        if not (Path(self.settings.model_base_path) / model).is_dir():
            raise ModelNotFound(f"model {model!r} is not served")
        return self.client.model_status(model, timeout_s=min(2.0, self._timeout()))

    def _timeout(self) -> float:
        return self.settings.request_timeout_s

    @staticmethod
    def _model_ref(done: Plan) -> dict[str, Any]:
        return {"name": done.assets.model, "version": done.assets.version}


def _prompt(assets: ModelAssets, prompt_name: str | None, input_type: str | None) -> str:
    """Return the prompt an embedding request's texts get; 422 for one the model lacks."""
    try:
        return prompt_for(assets.embedding, prompt_name, input_type)
    except ValueError as exc:
        raise UnprocessableInput(f"{exc} (model {assets.model!r})") from None


def _wanted_outputs(plan: Plan) -> tuple[str, ...]:
    """Return the signature outputs the plan's kinds read when they are fewer than the model's
    (a dense-only :embed of BGE-M3 leaves its token outputs on the model server), else ()."""
    outputs = plan.assets.outputs if plan.assets is not None else None
    if plan.options is None or outputs is None:
        return ()
    names = {"dense": (DENSE_OUTPUT,), "multivector": (TOKEN_VECTORS_OUTPUT,),
             "sparse": outputs.sparse.outputs if outputs.sparse is not None else ()}  # fmt: skip
    every = {n for kind, read in names.items() if getattr(outputs, kind) is not None
             for n in read}  # fmt: skip
    wanted = tuple(sorted({n for kind in plan.kinds for n in names.get(kind, ())}))
    return wanted if wanted and set(wanted) != every else ()


def _check_truncation(plan: Plan) -> None:
    """422 for an input the tokenizer cut when the request may not be cut (truncate false)."""
    if plan.truncate:
        return
    encoded = plan.encoded
    first = next((i for i, e in enumerate(encoded) if e.truncated), None)
    if first is not None:
        # only the cache's misses are tokenized: the error names the text's index in the request
        where = plan.positions[first] if plan.positions is not None else first
        raise TextTooLong(
            f"{plan.what}[{where}] needs {encoded[first].full_length} tokens, over "
            f"max_seq_len {plan.assets.max_seq_len} of model {plan.model!r}; send "
            "truncate=true to cut it"
        )


def _result_cache(settings: Settings) -> ResultCache | None:
    """Return the worker's result cache (with its shared tier when GATEWAY_CACHE_REDIS), or
    None when it is off."""
    if not (settings.cache_bytes and settings.cache_entries):
        return None
    shared = None
    if settings.cache_redis:
        shared = SharedTier(
            settings.cache_redis_target, settings.cache_redis_prefix, settings.cache_redis_ttl_s,
            settings.cache_redis_timeout_s, settings.cache_redis_retry_s,
            min(settings.cache_entry_bytes, settings.cache_bytes),
        )  # fmt: skip
    return ResultCache(settings.cache_bytes, settings.cache_entry_bytes, settings.cache_entries,
                       shared)  # fmt: skip


def _tier_answer(asked: int, hits: int, degraded: bool) -> str:
    """Return what the shared tier did for the ``asked`` texts (x-cache-shared)."""
    if degraded:
        return "degraded"
    return "hit" if hits == asked else "miss" if not hits else "partial"


def _cacheable(plan: Plan) -> bool:
    """Return whether the result cache keeps the plan's texts: one row per text of one shape
    (not token classification, not multi-vectors, whose rows are as long as their tokens) and
    a model call (not inference-free sparse queries). A request of a multi-vector model that
    asks for no multi-vectors is kept: its call is narrowed to the kinds asked, and the key
    holds them (issue 61: a dense-only request of a BGE-M3 export is cached)."""
    return not (plan.per_token or plan.from_idf or "multivector" in plan.kinds)


def embed_options(request: EmbedRequest) -> Options:
    """Return :embed's output options: the kinds asked, the query side (``is_query``, else
    Cohere's input_type search_query), the sparse limits and the output types; 422 for an
    is_query that contradicts input_type."""
    is_query = request.input_type == "search_query"
    if request.is_query is not None:
        if request.input_type is not None and request.is_query != is_query:
            raise UnprocessableInput(
                f"is_query {str(request.is_query).lower()} contradicts input_type "
                f"{request.input_type!r}: give one of them"
            )
        is_query = request.is_query
    return Options(
        kinds=tuple(dict.fromkeys(request.outputs)) if request.outputs else None,
        is_query=is_query, top_k=request.top_k, min_weight=request.min_weight or 0.0,
        with_tokens=request.return_tokens, types=tuple(request.embedding_types or ("float",)),
        encoding=request.encoding_format,
    )  # fmt: skip


def answered_kinds(model: str, outputs: ModelOutputs, options: Options) -> tuple[str, ...]:
    """Return the output kinds a request gets of a version with ``outputs``; 422 for a kind
    it lacks (naming those it has) or a sparse top_k over a SPLADE model's own."""
    kinds = options.kinds or outputs.default_kinds()
    missing = [kind for kind in kinds if kind not in outputs.kinds]
    if missing:
        raise UnprocessableInput(
            f"field 'outputs': model {model!r} has no {missing[0]} output (its outputs: "
            f"{', '.join(outputs.kinds)})"
        )
    spec = outputs.sparse
    topk = spec is not None and spec.form == "topk" and "sparse" in kinds
    if topk and spec is not None and options.top_k is not None and options.top_k > spec.top_k:
        raise UnprocessableInput(
            f"field 'top_k': {options.top_k} is over model {model!r}'s own top-k of "
            f"{spec.top_k} sparse entries"
        )
    return tuple(kinds)


def typed_embeddings(vectors: np.ndarray, types: Sequence[str]) -> dict[str, np.ndarray]:
    """Return ``vectors`` as each output type in ``types`` (backend/embeddings.py); 422 for
    int8/uint8 of vectors that are not unit vectors."""
    try:
        return {kind: quantize(vectors, kind) for kind in types}
    except ValueError as exc:
        raise UnprocessableInput(str(exc)) from None


def _colbert_sides(
    assets: ModelAssets,
    spec: MultiVectorOutput,
    query: str,
    documents: Sequence[str],
    direction: str | None,
) -> list[Encoded]:
    """Return a rerank's query on ColBERT's query side and its documents on the document side
    (markers, lengths, expansions: backend/outputs/multivector.py)."""
    tokenizer, out = assets.tokenizer, []
    for is_query, texts in ((True, [query]), (False, documents)):
        side = multivector.side_of(spec, is_query)
        if side is None:  # for mypy: the caller checked both sides exist
            raise ModelAssetsError(f"model {assets.model!r} has no ColBERT query/document side")
        most = multivector.max_tokens(side, assets.max_seq_len)
        encoded = tokenizer.encode(texts, direction=direction, max_len=most)
        marked = multivector.mark(encoded, side, is_query)
        budget.spend(0, sum(m.ids.shape[0] - e.ids.shape[0]
                            for m, e in zip(marked, encoded, strict=True)))  # fmt: skip
        out.extend(marked)
    return out


def _retrieval_scores(
    done: Plan, outputs: ModelOutputs, weights: Sequence[float] | None
) -> np.ndarray:
    """Return each document's score against the query (row 0) of a retrieval model: MaxSim
    (``score`` mean or sum) where it has multi-vectors, else the sparse lexical match; with
    ``weights``, FlagEmbedding's (w0 * dense + w1 * sparse + w2 * colbert) / sum(w)."""
    rows = [e.ids for e in done.encoded]
    count = len(rows) - 1
    colbert = lexical = np.zeros(count, dtype=np.float32)
    try:
        if outputs.multivector is not None:
            spec = outputs.multivector
            flags = [True] + [False] * count
            matrices = multivector.extract(spec, done.outputs, done.encoded, flags)
            colbert = np.asarray([multivector.maxsim(matrices[0], m, spec.score)
                                  for m in matrices[1:]], dtype=np.float32)  # fmt: skip
            if weights is None:
                return colbert
        if outputs.sparse is not None:
            found = sparse.extract(outputs.sparse, done.outputs, rows)
            if done.assets.sparse_idf is not None:  # inference-free: the query from the table
                found[0] = sparse.from_idf(rows[:1], done.assets.sparse_idf)[0]
            lexical = np.asarray([sparse.lexical(found[0], v) for v in found[1:]], np.float32)
            if weights is None:
                return lexical
        vectors = l2_normalize(done.outputs[DENSE_OUTPUT])
    except KeyError as exc:
        raise UpstreamError(f"the model returned no {exc.args[0]!r} output") from None
    dense_scores = (vectors[1:] @ vectors[0]).astype(np.float32)
    w = [float(x) for x in weights or (1.0, 1.0, 1.0)]
    if sum(w) <= 0:
        raise UnprocessableInput("field 'weights': their sum must be above 0")
    return ((w[0] * dense_scores + w[1] * lexical + w[2] * colbert) / sum(w)).astype(np.float32)


def _dense_only(model: str) -> Callable[[ModelAssets], None]:
    """Return the check of the dense-only routes (OpenAI's and Cohere's embeddings): 422 for a
    model without dense vectors, pointing to :embed."""

    def check(assets: ModelAssets) -> None:
        outputs = assets.outputs
        if outputs is not None and outputs.dense is None:
            raise UnprocessableInput(
                f"model {model!r} answers {', '.join(outputs.kinds)} only, no dense vectors: "
                f"this shape is dense; use POST /v1/models/{model}:embed"
            )

    return check


def _directed(direction: str | None) -> Encoder | None:
    """Return an encoder of the plan's texts that cuts on ``direction``'s side, or None for the
    tokenizer's own side (model.json's truncation_side: right unless the checkpoint said
    left)."""
    if direction is None:
        return None
    return lambda plan: plan.assets.tokenizer.encode(plan.texts, direction=direction)


def _paired(pairs: Sequence[tuple[str, str]], direction: str | None) -> Encoder:
    """Return an encoder of sentence pairs; 422 for a pair whose first segment fills the model."""

    def encode(plan: Plan) -> list[Encoded]:
        assets = plan.assets
        plan.characters = sum(len(a) + len(b) for a, b in pairs)
        try:
            return assets.tokenizer.encode_pairs(pairs, direction)
        except FirstSegmentTooLong as exc:
            raise TextTooLong(f"{exc} (model {assets.model!r})") from None

    return encode


def _positive(model: str, assets: ModelAssets) -> int:
    """Return the column of a cross-encoder's score for ranking; 422 when it has none."""
    index = positive_index(assets.labels)
    if index is None:
        raise UnprocessableInput(
            f"model {model!r} is {assets.head.describe()} with labels {list(assets.labels)}: "
            "none of them is a positive label to rank by"
        )
    return index

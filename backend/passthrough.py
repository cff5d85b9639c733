"""TF Serving's own REST API through the gateway, for any model its serving config lists.

The routes under ``/tfs`` (``backend/api/tfs.py``) take TF Serving's paths and bodies unchanged.
What the gateway adds happens here and in the app's hooks: the API key's reach, the body's rows and
elements checked before the call, the routing file's weights for default traffic, a deadline, the
call's span and metrics. Over the REST upstream the body goes on as it came and TF Serving's answer
comes back byte for byte; over gRPC the body becomes a PredictRequest by TF Serving's JSON rules
(``backend/tfs_json.py``) and the reply is written back as TF Serving's REST API writes it.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

import numpy as np

from backend import auth, routing, timing, tracing
from backend.errors import PayloadTooLarge, UpstreamStatus, UpstreamTimeout
from backend.shadow import ShadowJob
from backend.tensors import fill_tensor_proto, from_tensor_proto
from backend.tfs_json import (
    TfsError,
    classify_body,
    debug_string,
    decode_predict,
    input_from_json,
    metadata_body,
    predict_body,
    regress_body,
    request_size,
    status_body,
)
from modelformat.protos import serving_pb2

if TYPE_CHECKING:
    from backend.clients import PredictClient
    from backend.routing import RoutingTable
    from backend.settings import Settings
    from backend.versions import LabelTable


class Upstream(Protocol):
    """What the passthrough reads of the worker's gateway (backend/service.py's ``Gateway``,
    which owns this object: naming it here would make the two modules import each other)."""

    settings: Settings
    client: PredictClient
    labels: LabelTable
    routing: RoutingTable

    def shadow_upstream(self) -> Any: ...

    def passthrough(self) -> Passthrough: ...


SIGNATURE = "serving_default"
VERBS = ("predict", "classify", "regress")


@dataclass
class Target:
    """Where a request goes: the model, and the version or label it (or the routing file) named."""

    model: str
    version: int | None = None
    label: str | None = None
    route: Any = None  # the routing file's entry, for default traffic

    def path(self, suffix: str = "") -> str:
        """Return TF Serving's REST path of this target, with ``suffix`` (``:predict``...)."""
        path = f"/v1/models/{quote(self.model, safe='')}"
        if self.version is not None:
            path += f"/versions/{self.version}"
        elif self.label is not None:
            path += f"/labels/{quote(self.label, safe='')}"
        return path + suffix

    def spec(self, spec: Any, signature: str | None = None) -> None:
        """Fill a ModelSpec with this target (and ``signature``)."""
        spec.name = self.model
        if self.version is not None:
            spec.version.value = self.version
        elif self.label is not None:
            spec.version_label = self.label
        if signature is not None:
            spec.signature_name = signature


@dataclass
class Answer:
    """TF Serving's answer: HTTP status, body, and the version that served it (when known)."""

    status: int
    body: bytes
    version: int | None = None


class Passthrough:
    """Per-worker state of the passthrough routes: signatures the gRPC upstream looked up."""

    def __init__(self, gateway: Upstream) -> None:
        self.gateway = gateway
        self.settings = gateway.settings
        self._signatures: dict[tuple[str, int | None, str | None], tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def served_models(self) -> list[str]:
        """Return the models the serving config lists (the bounded set metrics may name)."""
        return self.gateway.labels.models()

    def target(self, model: str, version: int | None, label: str | None) -> Target:
        """Return the request's target: 403 for a version or label the API key may not name;
        default traffic follows the routing file's weights."""
        if version is not None or label is not None:
            routing.pinned.set(True)
            return self.named(model, version, label)
        route = self.gateway.routing.route(model)
        if route is not None and route.weights:
            return Target(model, self.gateway.routing.choose(model, route), None, route)
        return Target(model, route=route)

    def named(self, model: str, version: int | None, label: str | None) -> Target:
        """Return the target a path names as it names it (status, metadata, a pinned call): 403
        for a version or label the API key may not name, as for :predict."""
        key = auth.current_key.get()
        if key is not None and (version is not None or label is not None):
            labels = self.gateway.labels.labels(model)
            public = self.settings.public_label_names
            auth.check_reach(key, model, version, label, labels, public)
        return Target(model, version, label)

    def known_version(self, target: Target) -> int | None:
        """Return the version a target names, a label resolved by the serving config."""
        if target.version is not None:
            return target.version
        if target.label is not None:
            return self.gateway.labels.labels(target.model).get(target.label)
        return None

    # -- GET: status and metadata ------------------------------------------------------------

    def status(self, target: Target) -> Answer:
        """Return TF Serving's model-status answer (all versions, or the one named)."""
        client = self.gateway.client
        deadline = self._deadline()
        if client.transport == "rest":
            return self._forward("GET", target, "", None, deadline)
        request = serving_pb2.GetModelStatusRequest()
        request.model_spec.name = target.model
        if target.version is not None:  # TF Serving ignores a label here: all versions come back
            request.model_spec.version.value = target.version
        reply = self._grpc("status", request, target, deadline)
        return Answer(200, status_body(reply).encode())

    def metadata(self, target: Target) -> Answer:
        """Return TF Serving's metadata answer (model_spec and the signature_def map)."""
        deadline = self._deadline()
        if self.gateway.client.transport == "rest":
            return self._forward("GET", target, "/metadata", None, deadline)
        reply = self._metadata_reply(target, deadline)
        signatures = serving_pb2.SignatureDefMap.FromString(reply.metadata["signature_def"].value)
        body = metadata_body(reply, signatures).encode()
        return Answer(200, body, reply.model_spec.version.value)

    # -- POST: predict, classify, regress ----------------------------------------------------

    def infer(
        self, verb: str, target: Target, body: bytes, doc: Any, size: tuple[int, int] | None = None
    ) -> Answer:
        """Return TF Serving's answer to ``:verb`` with ``body`` (``doc``: its JSON as TF Serving
        reads it, ``tfs_json.parse_body``: a body the gateway can't read and count is refused
        before this, over either upstream; ``size``: its (rows, elements) if counted already,
        ``tfs_json.read_body``)."""
        rows = self.check_size(doc, size)
        deadline = self._deadline()  # one for the whole request: metadata, then the call
        transport = self.gateway.client.transport
        version = self.known_version(target)
        signature = doc.get("signature_name") if isinstance(doc, dict) else None
        with tracing.upstream_call(
            target.model, -1 if version is None else version, signature, rows, transport
        ):
            if transport == "rest":
                answer = self._forward("POST", target, f":{verb}", body, deadline)
            elif verb == "predict":
                answer = self._grpc_predict(target, doc, deadline, body)
            else:
                answer = self._grpc_examples(verb, target, doc, deadline)
        if answer.version is None:
            answer.version = version
        clock = timing.current()
        if clock is not None:
            clock.inferred = True  # an inference's answer: it carries the timing headers
        return answer

    def check_size(self, doc: Any, size: tuple[int, int] | None = None) -> int:
        """Return a body's rows; 413 when it holds more rows or elements than the gateway's
        limits allow (``size``: its (rows, elements), counted here if not given)."""
        rows, elements = request_size(doc) if size is None else size
        settings = self.settings
        if rows > settings.max_request_rows:
            raise PayloadTooLarge(
                f"the body has {rows} rows, over the limit of {settings.max_request_rows} "
                "(GATEWAY_MAX_REQUEST_ROWS)"
            )
        if elements > settings.tfs_max_elements:
            raise PayloadTooLarge(
                f"the body has {elements} tensor elements, over the limit of "
                f"{settings.tfs_max_elements} (GATEWAY_TFS_MAX_ELEMENTS)"
            )
        return rows

    def _grpc_predict(
        self, target: Target, doc: Any, deadline: float, text: bytes | None = None
    ) -> Answer:
        if not isinstance(doc, dict):
            raise TfsError(f"JSON Value: {debug_string(doc)} Is not object")
        name = doc.get("signature_name", "")
        if not isinstance(name, str):
            raise TfsError(
                f"JSON Value: {debug_string(doc)} not formatted correctly. 'signature_name' key "
                "must be a string value."
            )
        signature = name or SIGNATURE
        sigs = self._signatures_of(target, deadline)
        if signature not in sigs.signature_def:
            raise TfsError(f'Serving signature name: "{signature}" not found in signature def')
        with timing.stage("plan"):  # JSON → tensors
            sig = sigs.signature_def[signature]
            inputs, row_format = decode_predict(doc, sig, name or "DEFAULT", text)
            request = serving_pb2.PredictRequest()
            target.spec(request.model_spec, signature)
            for alias, array in inputs.items():
                fill_tensor_proto(request.inputs[alias], array)
        reply = self._grpc("predict", request, target, deadline)
        with timing.stage("postprocess"):  # tensors → TF Serving's JSON
            outputs = {alias: from_tensor_proto(t) for alias, t in reply.outputs.items()}
            body = predict_body(outputs, row_format)
        return Answer(200, body.encode(), reply.model_spec.version.value or None)

    def _grpc_examples(self, verb: str, target: Target, doc: Any, deadline: float) -> Answer:
        """Classify or Regress: the body's tf.Examples in one call, its result as TF Serving's
        REST API writes it."""
        with timing.stage("plan"):  # JSON → tf.Examples
            request_input = input_from_json(doc)
            name = doc.get("signature_name", "")
            if not isinstance(name, str):
                raise TfsError(
                    f"JSON Value: {debug_string(doc)} not formatted correctly. 'signature_name' "
                    "key must be a string value."
                )
            kind = serving_pb2.ClassificationRequest if verb == "classify" else (
                serving_pb2.RegressionRequest
            )  # fmt: skip
            request = kind(input=request_input)
            target.spec(request.model_spec, name)
        reply = self._grpc(verb, request, target, deadline)
        with timing.stage("postprocess"):
            write = classify_body if verb == "classify" else regress_body
            body = write(reply.result)
        return Answer(200, body.encode(), reply.model_spec.version.value or None)

    def predict_outputs(self, target: Target, doc: Any) -> dict[str, np.ndarray]:
        """Return the raw outputs of a predict body on ``target`` (the shadow's comparison)."""
        deadline = self._deadline()
        answer = self._grpc_predict(target, doc, deadline) if (
            self.gateway.client.transport == "grpc"
        ) else self._forward("POST", target, ":predict", None, deadline, doc)  # fmt: skip
        if answer.status != 200:
            raise UpstreamStatus(answer.body.decode(errors="replace"), answer.status)
        return raw_outputs(answer.body)

    def _signatures_of(self, target: Target, deadline: float) -> Any:
        """Return the target's SignatureDefMap (a version's cached for good, else for the
        labels' re-read interval)."""
        key = (target.model, target.version, target.label)
        now = time.monotonic()
        with self._lock:
            cached = self._signatures.get(key)
        if cached is not None and (target.version is not None or cached[0] > now):
            return cached[1]
        reply = self._metadata_reply(target, deadline)
        sigs = serving_pb2.SignatureDefMap.FromString(reply.metadata["signature_def"].value)
        with self._lock:
            if len(self._signatures) > 256:
                self._signatures.clear()
            self._signatures[key] = (now + self.settings.labels_cache_s, sigs)
        return sigs

    def _metadata_reply(self, target: Target, deadline: float) -> Any:
        request = serving_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        target.spec(request.model_spec)
        return self._grpc("metadata", request, target, deadline)

    def _deadline(self) -> float:
        """Return the deadline of a request starting now (GATEWAY_TIMEOUT_S for all its calls)."""
        return time.monotonic() + self.settings.request_timeout_s

    def _left(self, deadline: float) -> float:
        """Return the seconds left before ``deadline``; 504 when none are."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise UpstreamTimeout(
                f"the request's deadline ({self.settings.request_timeout_s:.3g}s, "
                "GATEWAY_TIMEOUT_S) passed before the model server was asked"
            )
        return left

    def _grpc(self, method: str, request: Any, target: Target, deadline: float) -> Any:
        """Return the model server's reply to one call; a 413 for a reply over the answer budget
        (the channel refuses one over the budget plus its margin before reading it in; between
        the two it is read, then counted here, before any answer is built from it)."""
        client: Any = self.gateway.client
        with timing.stage("call"):
            reply = client.forward(
                method, request, model=target.model, version=target.version,
                timeout_s=self._left(deadline),
            )  # fmt: skip
        most = self.settings.max_answer_bytes
        if most > 0 and reply.ByteSize() > most:
            raise PayloadTooLarge(
                f"the model server's reply is {reply.ByteSize()} bytes, over the limit of {most} "
                "bytes per answer (GATEWAY_MAX_ANSWER_BYTES)"
            )
        return reply

    def _forward(
        self, method: str, target: Target, suffix: str, body: bytes | None, deadline: float,
        doc: Any = None,
    ) -> Answer:  # fmt: skip
        client: Any = self.gateway.client
        if body is None and doc is not None:
            body = _json_bytes(doc)
        with timing.stage("call"):
            status, content = client.forward(
                method, target.path(suffix), body, model=target.model, version=target.version,
                timeout_s=self._left(deadline),
            )  # fmt: skip
        return Answer(status, content)

    def shadow_job(self, target: Target, answer: Answer, doc: Any) -> None:
        """Leave the shadow job of a default :predict for the app to queue (routing file)."""
        route, served = target.route, answer.version
        if route is None or served is None or doc is None or answer.status != 200:
            return
        shadow = self.gateway.routing.shadow_for(route, served)
        if shadow is None:
            return
        model = target.model

        def run() -> tuple[list[str], dict[str, np.ndarray]]:
            upstream = self.gateway.shadow_upstream()
            mine = upstream.passthrough() if upstream is not self.gateway else self
            return [], mine.predict_outputs(Target(model, shadow), doc)

        routing.pending_shadow.set(ShadowJob(
            model=model, task=TFS_TASK, served_version=served, shadow_version=shadow, labels=[],
            outputs=raw_outputs(answer.body), run=tracing.linked("gateway.shadow", run, {
                "gateway.model": model, "gateway.version": served, "gateway.shadow_version": shadow,
            }),
        ))  # fmt: skip


TFS_TASK = "tfs"


def raw_outputs(body: bytes) -> dict[str, np.ndarray]:
    """Return a predict answer's numbers by output name (one unnamed output: ``""``); outputs
    that are not numeric are left out (the shadow compares numbers)."""
    doc = json.loads(body)
    value = doc.get("predictions", doc.get("outputs"))
    rows = doc.get("predictions") is not None
    if rows and value and isinstance(value[0], dict):
        value = {name: [row[name] for row in value] for name in value[0]}
    named = value if isinstance(value, dict) else {"": value}
    out = {}
    for name, tensor in named.items():
        try:
            out[name] = np.asarray(tensor, dtype=np.float64)
        except (TypeError, ValueError):
            continue
    return out


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc).encode()

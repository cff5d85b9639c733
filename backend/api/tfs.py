"""TF Serving's REST API under ``/tfs`` for every model of the serving config (passthrough.py).

``/tfs/v1/models/{model}[/versions/{v}|/labels/{l}]`` answers GET (status), GET ``/metadata`` and
POST ``:predict``, ``:classify`` and ``:regress`` with TF Serving's own bodies and errors; the
gateway's own refusals (401/403/413/429/503/504) come in TF Serving's error shape too.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, g, request

from backend import timing
from backend.api import current_gateway, request_body
from backend.errors import ERROR_SHAPES, PATH_SHAPES, GatewayError, UpstreamStatus
from backend.passthrough import Answer
from backend.tfs_json import TfsError, error_body, read_body

bp = Blueprint("tfs", __name__, url_prefix="/tfs/v1/models")


def tfs_error(error: GatewayError) -> dict[str, Any]:
    """Return TF Serving's error body, ``{"error": message}``."""
    return {"error": error.message}


ERROR_SHAPES[bp.name] = tfs_error
PATH_SHAPES["/tfs/"] = tfs_error
INT64_MAX = 2**63 - 1

VERB = "<any(predict, classify, regress):verb>"


@bp.get("/<name:model>")
@bp.get("/<name:model>/versions/<int:version>")
@bp.get("/<name:model>/labels/<name:label>")
def status(model: str, version: int | None = None, label: str | None = None) -> Response:
    """TF Serving's model status: every version's state (or the one named)."""
    if _too_big(version):
        return _error(_version_error(version))
    return _answered(lambda p: p.status(p.named(model, version, label)), model)


@bp.get("/<name:model>/metadata")
@bp.get("/<name:model>/versions/<int:version>/metadata")
@bp.get("/<name:model>/labels/<name:label>/metadata")
def metadata(model: str, version: int | None = None, label: str | None = None) -> Response:
    """TF Serving's model metadata: the model spec and its signature_def map."""
    if _too_big(version):
        return _error(_version_error(version))
    return _answered(lambda p: p.metadata(p.named(model, version, label)), model)


@bp.post(f"/<name:model>:{VERB}")
@bp.post(f"/<name:model>/versions/<int:version>:{VERB}")
@bp.post(f"/<name:model>/labels/<name:label>:{VERB}")
def infer(model: str, verb: str, version: int | None = None, label: str | None = None) -> Response:
    """TF Serving's :predict, :classify and :regress, limits and routing added."""
    passthrough = current_gateway().passthrough()
    with timing.stage("validate"):
        most = passthrough.settings.tfs_max_body_bytes
        if (request.content_length or 0) > most:  # refused before it is read
            return _error(_body_too_large(request.content_length or 0, most))
        body = request_body()
        if len(body) > most:
            return _error(_body_too_large(len(body), most))
        if _too_big(version):
            return _error(_version_error(version))
        try:  # as TF Serving's parser reads it; what can't be read and counted goes no further
            doc, size = read_body(body, passthrough.settings.tfs_max_values)
        except TfsError as exc:
            return _error(exc)
        target = passthrough.target(model, version, label)
    answer = _answered_raw(lambda p: p.infer(verb, target, body, doc, size), model)
    if isinstance(answer, Response):
        return answer
    if verb == "predict":
        passthrough.shadow_job(target, answer, doc)
    return _response(answer)


def _answered(call: Any, model: str) -> Response:
    answer = _answered_raw(call, model)
    return answer if isinstance(answer, Response) else _response(answer)


def _answered_raw(call: Any, model: str) -> Answer | Response:
    """Run ``call`` on the worker's passthrough; note the model (and version) it served, a
    model the serving config doesn't list as 'other' (metrics name configured models only)."""
    passthrough = current_gateway().passthrough()
    g.served_model = model if model in passthrough.served_models() else "other"
    try:
        answer: Answer = call(passthrough)
    except TfsError as exc:
        return _error(exc)
    except UpstreamStatus as exc:  # the model server's own error (gRPC): TF Serving's REST bytes
        return _error(TfsError(exc.message, exc.status_code))
    if answer.version is not None and g.served_model != "other":
        g.served_version = answer.version
    return answer


def _body_too_large(size: int, most: int) -> TfsError:
    return TfsError(
        f"the body has {size} bytes, over the limit of {most} (GATEWAY_TFS_MAX_BODY_BYTES)", 413
    )


def _too_big(version: int | None) -> bool:
    return version is not None and version > INT64_MAX


def _version_error(version: int | None) -> TfsError:
    """TF Serving's answer to a version over int64 (SimpleAtoi fails)."""
    return TfsError(f"Failed to convert version: {version} to numeric.")


def _error(exc: TfsError) -> Response:
    return Response(error_body(exc.message), status=exc.status, mimetype="application/json")


def _response(answer: Answer) -> Response:
    with timing.stage("answer"):
        return Response(answer.body, status=answer.status, mimetype="application/json")

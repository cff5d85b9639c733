"""Liveness and readiness."""

from __future__ import annotations

from flask import Blueprint, Response

from backend.api import current_gateway, json_response

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    """Return 200 while the process can answer HTTP at all."""
    return json_response({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    """Return 200 when the model server answers and the configured models are AVAILABLE, else
    503 (``backend.readiness``)."""
    return json_response(current_gateway().readiness())

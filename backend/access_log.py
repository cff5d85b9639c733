"""gunicorn's access and error logs as one JSON object per line (``logger_class`` in
gunicorn.conf.py); GATEWAY_LOG_FORMAT=text keeps gunicorn's own text lines.

An access line names the request's route (the URL rule, not the URL), model, served version,
status, duration and trace id (the request span's, or the caller's ``traceparent``'s when tracing
is off); never an API key (only its name) and never a text of the request. An error line carries
the trace id of the request it was logged in.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import traceback
from typing import Any

import orjson
from gunicorn.glogging import Logger


def access_record(
    method: str,
    path: str,
    query: str,
    status: Any,
    sent: int | None,
    duration_s: float,
    **extra: Any,
) -> dict[str, Any]:
    """Return one access-log record (pure, so it can be tested without gunicorn)."""
    code = int(str(status).split(None, 1)[0]) if status is not None else 0
    record: dict[str, Any] = {
        "ts": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        "method": method,
        "path": path,
        "status": code,
        "bytes": sent or 0,
        "duration_ms": round(duration_s * 1000, 3),
    }
    if query:
        record["query"] = query
    record.update({k: v for k, v in extra.items() if v not in (None, "", "-")})
    return record


class JsonFormatter(logging.Formatter):
    """One JSON object per log record: time, level, logger, message, trace id, traceback."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as one JSON line."""
        from backend import timing  # the running request's trace id, if any

        entry: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        clock = timing.current()
        if clock is not None and clock.trace_id:
            entry["trace_id"] = clock.trace_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def _log_format() -> str:
    from backend.settings import load_settings

    return load_settings().log_format


class JsonAccessLogger(Logger):
    """gunicorn Logger whose access and error lines are JSON (values escaped; no format string
    to break), or gunicorn's text with GATEWAY_LOG_FORMAT=text."""

    def setup(self, cfg: Any) -> None:
        """Set up gunicorn's handlers, then make the error log's lines JSON (unless text)."""
        super().setup(cfg)
        self.json = _log_format() == "json"
        if self.json:
            for handler in self.error_log.handlers:
                handler.setFormatter(JsonFormatter())
            # Every library's records (OpenTelemetry's propagators quote the headers they could
            # not parse, grpc, urllib3) go to the root logger: without a handler there, Python's
            # last resort writes their text raw to stderr, a client's header text included.
            logging.getLogger().handlers = list(self.error_log.handlers)

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        """Write one JSON line for a finished request."""
        if not self.access_log_enabled:
            return
        if not getattr(self, "json", True):
            super().access(resp, req, environ, request_time)
            return
        try:
            record = access_record(
                environ.get("REQUEST_METHOD", "-"),
                environ.get("PATH_INFO", "-"),
                environ.get("QUERY_STRING", ""),
                resp.status,
                getattr(resp, "sent", None),
                request_time.total_seconds(),
                remote=environ.get("REMOTE_ADDR"),
                user_agent=environ.get("HTTP_USER_AGENT"),
                request_id=environ.get("HTTP_X_REQUEST_ID"),
                route=environ.get("gateway.route"),
                model=environ.get("gateway.model"),
                version=environ.get("gateway.version"),
                trace_id=environ.get("gateway.trace_id"),
                key=environ.get("gateway.api_key"),  # the key's name, never the key
                pid=os.getpid(),
            )
            self.access_log.info(orjson.dumps(record).decode())
        except Exception:
            self.error(traceback.format_exc())

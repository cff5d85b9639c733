"""gunicorn's access log as one JSON object per line (``logger_class`` in gunicorn.conf.py)."""

from __future__ import annotations

import datetime as dt
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


class JsonAccessLogger(Logger):
    """gunicorn Logger whose access lines are JSON (values escaped; no format string to break)."""

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        """Write one JSON line for a finished request."""
        if not self.access_log_enabled:
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
                key=environ.get("gateway.api_key"),  # the key's name, never the key
                pid=os.getpid(),
            )
            self.access_log.info(orjson.dumps(record).decode())
        except Exception:
            self.error(traceback.format_exc())

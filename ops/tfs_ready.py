"""Is this TF Serving replica ready? Only when every version models.config names is AVAILABLE.

TF Serving opens its ports (and its status route answers 200) once *any* version of each model
has loaded, so a probe on the port or on ``GET /v1/models/<name>`` lets a new replica take
requests for ``stable`` or an explicit version it is still loading: 404s during every rolling
update and scale-up. This check reads models.config (the same file the replica serves) and
requires, for every model, each version its labels name and each version its policy serves
(``specific``: those listed; ``latest {N}``: the N newest on disk; ``all``: every one on disk)
to be AVAILABLE on the replica's REST port. No model name is written anywhere else.

  python -m ops.tfs_ready --config /models/models.config               # once: exit 0 / 1
  python -m ops.tfs_ready --config /models/models.config --serve 8502  # GET /ready for probes

Runs without TensorFlow (the config is read into modelformat's TF-free subset).
"""

from __future__ import annotations

import argparse
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import requests

from modelformat import layout, serverconfig
from modelformat.errors import FormatError
from modelformat.status import from_rest
from ops.modelconfig import policy_versions


def required_versions(config_path: Path) -> dict[str, set[int]]:
    """Return model name -> the versions a replica must have AVAILABLE to be ready."""
    config = serverconfig.read(config_path)
    wanted: dict[str, set[int]] = {}
    for model in config.model_config_list.config:
        on_disk = layout.list_versions(model.base_path)
        wanted[model.name] = policy_versions(model, on_disk) | set(model.version_labels.values())
    return wanted


def missing_versions(config_path: Path, rest_url: str, timeout_s: float) -> list[str]:
    """Return what keeps the replica at ``rest_url`` from being ready ([] = ready)."""
    try:
        wanted = required_versions(config_path)
    except FormatError as exc:
        return [f"models.config: {exc}"]
    if not wanted:
        return ["models.config names no model"]
    missing = []
    with requests.Session() as session:
        for name, versions in sorted(wanted.items()):
            try:
                reply = session.get(f"{rest_url}/v1/models/{name}", timeout=timeout_s)
                states = from_rest(reply.json()) if reply.status_code == 200 else []
            except (requests.RequestException, ValueError) as exc:
                return [f"{name}: no status from {rest_url} ({type(exc).__name__})"]
            available = {s.version for s in states if s.state == "AVAILABLE"}
            missing += [f"{name} v{v} not AVAILABLE" for v in sorted(versions - available)]
            if not versions and not available:
                missing.append(f"{name}: no version AVAILABLE")
    return missing


def serve(port: int, config_path: Path, rest_url: str, timeout_s: float) -> None:
    """Answer ``GET /ready`` with 200 or 503 and the missing versions, until killed."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/ready":
                self._answer(404, {"error": "not found: GET /ready"})
                return
            missing = missing_versions(config_path, rest_url, timeout_s)
            self._answer(503 if missing else 200, {"ready": not missing, "missing": missing})

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = orjson.dumps(body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a probe every few seconds: no access log

    # As the ready-check container's PID 1 the kernel drops a signal that has no handler: without
    # this one SIGTERM did nothing, and every pod deletion waited its terminationGracePeriodSeconds
    # (30 s) for the SIGKILL.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


def _exit_on_signal(signum: int, frame: object) -> None:
    """Leave serve_forever (a probe in flight is cut: the pod is going away)."""
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", type=Path, required=True, help="the models.config TF Serving reads")
    p.add_argument("--rest", default="http://127.0.0.1:8501", help="the replica's REST base URL")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds per status request")
    p.add_argument("--serve", type=int, metavar="PORT", help="answer GET /ready on PORT")
    args = p.parse_args(argv)
    if args.serve is not None:
        serve(args.serve, args.config, args.rest, args.timeout)
        return 0
    missing = missing_versions(args.config, args.rest, args.timeout)
    print("ready" if not missing else "not ready: " + "; ".join(missing))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

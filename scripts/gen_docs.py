"""Generate the reference parts of docs/ from the code: `make docs` runs it; `--check` compares.

What it writes, each between ``<!-- BEGIN generated: NAME -->`` and ``<!-- END generated: NAME -->``
markers in a page whose prose is hand-written, or as a whole file:

- docs/reference/configuration.md: every GATEWAY_* setting of ``backend/settings.py`` (name,
  default, type) and every GATEWAY_* variable ``docker/gunicorn.conf.py`` reads, with its meaning;
- docs/reference/http-api.md: every route of the gateway's Flask ``url_map``;
  docs/reference/openapi.json: the OpenAPI document the gateway serves (default settings);
- docs/reference/metrics.md: every metric of ``backend/metrics.py`` (name, type, labels, help) and
  every TF-Serving metric ``modelserver/`` records, with the labels it records them with;
- docs/reference/cli.md and docs/reference/model-server.md: the ``--help`` of every command line;
- results/summary.md: regenerated from the run files under results/runs/ (benchmarks/runs.py).

A setting without a meaning in ``SETTING_MEANINGS`` below is an error: say what it does here.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from backend import metrics as gateway_metrics
from backend.app import create_app
from backend.openapi import openapi_document
from backend.settings import ENV_NAMES, Settings, load_settings
from benchmarks import runs
from ops.procs import REPO

DOCS = REPO / "docs"
REFERENCE = DOCS / "reference"
GUNICORN_CONF = REPO / "docker" / "gunicorn.conf.py"
MODELSERVER = REPO / "modelserver"

# What each setting means. backend/settings.py owns names, types and defaults; this owns the words.
SETTING_MEANINGS: dict[str, str] = {
    "GATEWAY_UPSTREAM": "`grpc`, `rest` or `local` (in-process predictor; that one imports "
    "TensorFlow)",
    "GATEWAY_TFS_GRPC": "model server gRPC target; several replicas with gRPC's own naming "
    "(`dns:///tf-serving-headless:8500`, `ipv4:10.0.0.5:8500,10.0.0.6:8500`), each call to one "
    "that reported its version "
    "([replicas](../guides/model-lifecycle.md#several-model-server-replicas))",
    "GATEWAY_TFS_REST": "model server REST base URL; several replicas as a comma-separated list "
    "(the same replica rules)",
    "GATEWAY_MODEL_BASE_PATH": "the model tree the model server reads (vocabularies and "
    "`model.json` come from here)",
    "GATEWAY_MODEL_CONFIG_FILE": "the serving config (`models.config`); version labels are read "
    "from it",
    "GATEWAY_DEFAULT_MODEL": "optional: a model `/readyz` requires AVAILABLE on every probe (the "
    "serving config's models are required until the worker is first ready)",
    "GATEWAY_TIMEOUT_S": "whole-request deadline; past it the answer is 504 (tokenization, "
    "windowing and `:tag` post-processing check it too)",
    "GATEWAY_MAX_TOKEN_IDS": "the longest token-id list `:detokenize` and `/v1/embeddings` take "
    "(checked on the raw JSON before any id is, integral floats such as `5.0` counted as ids; "
    "longer: 422)",
    "GATEWAY_PUBLIC_LABELS": "comma-separated labels every key may name (default `stable`); a "
    "version newer than the newest one they name is unvetted: only keys whose `versions` list it "
    "reach it ([security](../guides/security.md))",
    "GATEWAY_RATE_LIMIT_REDIS_URL": "a Redis URL: each key's rate limit shared by every pod "
    "(unset: per pod) ([security](../guides/security.md))",
    "GATEWAY_METRICS_BIND": "host:port of a second listener that alone serves `/metrics` "
    "(unset: `/metrics` on the main port)",
    "GATEWAY_TIMING_HEADERS": "TEI's `x-*-time`, `x-compute-tokens`/`-characters` and W3C "
    "`Server-Timing` on inference answers ([observability](../guides/observability.md))",
    "GATEWAY_LOG_FORMAT": "`json` (one object per access or error line, with the trace id) or "
    "`text`",
    "GATEWAY_STATUS_CACHE_S": "how long version states from the model server are cached (then the "
    "last answer, up to twice this old, is served while one refresh runs; an older one is "
    "refetched first)",
    "GATEWAY_STATUS_DEADLINE_S": "one deadline for asking every replica its version states; a "
    "replica slower than that while others answer gets no calls until it answers in time",
    "GATEWAY_LABELS_CACHE_S": "how often a worker re-reads the config file for labels, the routing "
    "file and the API keys file (their content: a stat() can hide a change on NFS)",
    "GATEWAY_MAX_BATCH": "texts per upstream call",
    "GATEWAY_MAX_CONCURRENT_CHUNKS": "upstream calls in flight per request",
    "GATEWAY_MAX_BODY_BYTES": "larger bodies get 413",
    "GATEWAY_MAX_TEXTS": "more texts (or pairs, documents with the query, lists of token ids) "
    "get 413, counted before any item is read; a body may hold 32 strings, lists and objects per "
    "text, and 256",
    "GATEWAY_MAX_TEXT_CHARS": "longer texts get 422",
    "GATEWAY_MAX_REQUEST_TOKENS": "tokens one request may send upstream once tokenized (every "
    "row's, specials and the overlaps of `long_text` windows counted; TEI's `max_batch_tokens`); "
    "checked right after tokenization, before any row is built: 413 naming the numbers; "
    "`:tokenize` (the tokens it lists) and `:detokenize` (the ids it decodes) spend it too, and "
    "a retry on another version within a request spends the same budget",
    "GATEWAY_MAX_REQUEST_ROWS": "upstream rows one request may cause (texts, pairs, the windows "
    "of `long_text` chunk and `:tag`, `:tokenize`'s texts, `:detokenize`'s lists; TEI's "
    "`max_client_batch_size`): 413 past it, as above, rows known before tokenizing checked "
    "before it",
    "GATEWAY_TFS_MAX_ELEMENTS": "tensor elements (numbers, strings, b64 values) one `/tfs` body "
    "may hold, counted before the call: 413 naming it past that "
    "([coming from TF Serving](../guides/coming-from-other-servers.md))",
    "GATEWAY_TFS_MAX_BODY_BYTES": "bytes of one `/tfs` body (within `GATEWAY_MAX_BODY_BYTES`): "
    "413 naming it past that, before the body is read. TF Serving's JSON is parsed whole (a "
    "parse error anywhere comes first, as there), each number a Python object, and checked in one "
    "pass: 1 MiB of numbers (524,000) cost a worker 50-80 ms of CPU on a loaded 2-core machine, "
    "512 KiB 40-60 ms, the default 256 KiB at most 30 ms "
    "([coming from TF Serving](../guides/coming-from-other-servers.md))",
    "GATEWAY_TFS_MAX_VALUES": "strings, lists and objects one `/tfs` body may hold, counted in "
    "its bytes before it is parsed (outside strings, member names included): 413 naming it past "
    "that. Each costs the parser tens of bytes and the checks a step (a 1 MiB body of `[],` is "
    "350,000 lists: ~30 MiB and ~0.4 s of a worker); numbers are not counted "
    "(`GATEWAY_TFS_MAX_ELEMENTS` bounds them). The default fits 512 rows of 8 "
    "([coming from TF Serving](../guides/coming-from-other-servers.md))",
    "GATEWAY_MAX_ANSWER_BYTES": "bytes the answer of one embedding request (`:embed`, "
    "`/v1/embeddings`, `/v2/embed`) may take, and the model server's reply to it, estimated per "
    "output kind from the tokenized rows before the model runs (multi-vectors: rows × dims numbers "
    "per output type; sparse: an index and a weight per entry; the reply: only the outputs the "
    "route reads, where the transport can narrow them, padded rows × numbers × 4 bytes on gRPC): "
    "413 past it; the gRPC channel's receive limit is it plus 1 MiB, and a `/tfs` reply past it "
    "is a 413 too",
    "GATEWAY_BUCKETING": "pad length-sorted chunks to 16/32/64/… buckets (`0`: pad to the longest)",
    "GATEWAY_GRPC_RETRIES": "retries (with jitter) on UNAVAILABLE only",
    "GATEWAY_RETRY_AFTER_S": "the `Retry-After` of a 503",
    "GATEWAY_DEBUG_ENDPOINTS": "`/debug/modules` (the tests use it to prove workers never load "
    "TensorFlow)",
    "GATEWAY_API_KEYS_FILE": "a file of named API keys (`python -m ops.apikeys` writes it); empty: "
    "no keys asked for ([clients and keys](../guides/clients-and-keys.md))",
    "GATEWAY_METRICS_REQUIRE_KEY": "`/metrics` asks for an API key too (when keys are on)",
    "GATEWAY_DEFAULT_SPEED": "early-exit models: the `speed` of a request that gives none (0 = the "
    "full model … 1 = the earliest exit); unset: the model's own `early_exit.default_speed` from "
    "`model.json`, else 0",
    "GATEWAY_ROUTING_FILE": "weights and shadow per model ([rollouts](../guides/rollouts.md)); "
    "empty: `routing.yaml` beside the serving config",
    "GATEWAY_SHADOW_QUEUE": "shadow requests that may wait per worker behind the one running; more "
    'are dropped and counted (`gateway_shadow_requests_total{outcome="dropped"}`)',
    "GATEWAY_SHADOW_TIMEOUT_S": "deadline of one shadow call",
    "GATEWAY_SHADOW_TFS_GRPC": "model servers of the shadow's own (the same forms as "
    "`GATEWAY_TFS_GRPC`): shadow calls go there, with their own version states, so they never "
    "queue beside clients' calls; empty: the clients' model servers",
    "GATEWAY_SHADOW_TFS_REST": "the same for the REST upstream (the same forms as "
    "`GATEWAY_TFS_REST`)",
    "GATEWAY_GROUP_IN_FLIGHT": "upstream calls of one kind (model, version, length bucket) a "
    "worker runs at once; requests that arrive meanwhile share the next call, up to "
    "`GATEWAY_MAX_BATCH` rows (no timer: a lone request never waits); `0`: every request calls "
    "alone",
    "GATEWAY_CACHE_BYTES": "bytes the result cache's entries may hold per worker (least recently "
    "used out first); `0`: the cache is off (docs/guides/result-cache.md)",
    "GATEWAY_CACHE_ENTRY_BYTES": "the most bytes one result-cache entry may hold: a bigger "
    "answer is computed and not kept",
    "GATEWAY_CACHE_ENTRIES": "the most entries the result cache keeps per worker",
    "GATEWAY_CACHE_SHARED_KEYS": "share result-cache entries across API keys (else each key's "
    "are its own: a hit's timing would tell one key what another sent)",
    "GATEWAY_CACHE_REDIS": "the result cache's shared tier: Redis behind every worker's cache, "
    "so a text one worker or pod computed is a hit in the others (needs `GATEWAY_CACHE_BYTES`; "
    "docs/guides/result-cache.md)",
    "GATEWAY_CACHE_REDIS_URL": "the shared tier's Redis (the same forms as "
    "`GATEWAY_RATE_LIMIT_REDIS_URL`); empty: the rate limits' Redis, once `GATEWAY_CACHE_REDIS` "
    "is on",
    "GATEWAY_CACHE_REDIS_PREFIX": "the prefix of the shared tier's keys (Redis's ACL names it: "
    "deploy/k8s/base/redis.yaml)",
    "GATEWAY_CACHE_REDIS_TTL_S": "how long Redis keeps a shared entry (an entry is never stale: "
    "its key holds the served version; the TTL bounds what Redis holds of retired versions)",
    "GATEWAY_CACHE_REDIS_TIMEOUT_S": "the most one call to the shared tier waits (one MGET or "
    "one pipeline of PSETEXs per request); past it the texts are computed",
    "GATEWAY_CACHE_REDIS_RETRY_S": "after a failed or timed-out call, how long a worker skips the "
    "shared tier before asking Redis again",
    # docker/gunicorn.conf.py
    "GATEWAY_BIND": "the address gunicorn listens on",
    "GATEWAY_WORKERS": "gunicorn worker processes (default: the CPU cores this process may use)",
    "GATEWAY_THREADS": "threads per worker (they overlap requests waiting upstream)",
    "GATEWAY_WORKER_CLASS": "gunicorn's worker class (default "
    "`backend.httpworker.LingeringThreadWorker`; `gthread` is gunicorn's own)",
    "GATEWAY_ACCESS_LOG": "where the JSON access log goes (`-`: stdout; empty turns it off)",
    "GATEWAY_LOG_LEVEL": "gunicorn's log level",
    "GATEWAY_CONTROL_SOCKET": "the path of gunicorn's control socket (off unless set)",
    "GATEWAY_HEADER_TIMEOUT_S": "a request's head must arrive within this of its first byte, "
    "else 408 `request_timeout` and close (no pool thread waits on it)",
    "GATEWAY_BODY_TIMEOUT_S": "its body within this of the head, else 408; also bounds each "
    "blocking read or write a thread still does",
    "GATEWAY_KEEPALIVE_S": "how long an idle keep-alive connection is kept (and lingered on)",
    "GATEWAY_MAX_REQUESTS": "restart a worker after this many requests (0: never; jitter a "
    "tenth); a request already sent is answered with `Connection: close`",
}
# Defaults of the variables docker/gunicorn.conf.py reads (it has no settings object to ask).
GUNICORN_DEFAULTS: dict[str, str] = {
    "GATEWAY_BIND": "`0.0.0.0:8000`",
    "GATEWAY_WORKERS": "(cores)",
    "GATEWAY_THREADS": "`32`",
    "GATEWAY_WORKER_CLASS": "(lingering gthread)",
    "GATEWAY_ACCESS_LOG": "`-`",
    "GATEWAY_LOG_LEVEL": "`info`",
    "GATEWAY_CONTROL_SOCKET": "(none)",
    "GATEWAY_HEADER_TIMEOUT_S": "`10`",
    "GATEWAY_BODY_TIMEOUT_S": "`10`",
    "GATEWAY_KEEPALIVE_S": "`5`",
    "GATEWAY_MAX_REQUESTS": "`0`",
}

# Command lines whose --help goes into docs/reference/cli.md: (what a user types, python's argv).
PYTHON_MODULES: list[tuple[str, list[str]]] = [
    ("python -m export build", ["-m", "export", "build"]),
    ("python -m export inspect", ["-m", "export", "inspect"]),
    ("python -m export verify", ["-m", "export", "verify"]),
    ("python -m finetune", ["-m", "finetune"]),
    ("python -m finetune distill-exits", ["-m", "finetune", "distill-exits"]),
    ("python -m finetune.demo", ["-m", "finetune.demo"]),
    ("python -m finetune.heads_demo", ["-m", "finetune.heads_demo"]),
    ("python -m ops.apikeys", ["-m", "ops.apikeys"]),
    ("python -m ops.apikeys add", ["-m", "ops.apikeys", "add"]),
    ("python -m ops.apikeys remove", ["-m", "ops.apikeys", "remove"]),
    ("python -m ops.tfs_ready", ["-m", "ops.tfs_ready"]),
    ("python -m ops.demo", ["-m", "ops.demo"]),
    ("python -m ops.load", ["-m", "ops.load"]),
    ("python -m ops.batch", ["-m", "ops.batch"]),
    ("python -m ops.rollout migrate", ["-m", "ops.rollout", "migrate"]),
    ("python -m ops.drills", ["-m", "ops.drills"]),
]
MODEL_SERVER: tuple[str, list[str]] = ("python -m modelserver", ["-m", "modelserver"])


def block(name: str, body: str) -> str:
    """Return ``body`` between the markers of the generated block ``name``."""
    return (
        f"<!-- BEGIN generated: {name} "
        "(scripts/gen_docs.py; change the code, then `make docs`) -->\n"
        f"{body.rstrip()}\n<!-- END generated: {name} -->"
    )


def replace_block(text: str, name: str, body: str) -> str:
    """Return ``text`` with its generated block ``name`` replaced by ``body``."""
    key = re.escape(name)
    pattern = re.compile(
        rf"<!-- BEGIN generated: {key} .*?-->\n.*?<!-- END generated: {key} -->", re.S
    )
    if not pattern.search(text):
        raise SystemExit(f"no generated block {name!r} in the page: add its two markers")
    return pattern.sub(lambda _: block(name, body), text, count=1)


def _default(value: Any) -> str:
    if value is None or value == "":
        return "(none)"
    if isinstance(value, bool):
        return f"`{int(value)}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


def gunicorn_variables() -> list[str]:
    """Return the GATEWAY_* variables docker/gunicorn.conf.py reads, in file order: every quoted
    GATEWAY_* name, however it is read (``os.environ.get("…")``, ``os.environ["…"]``, a helper
    such as ``_seconds("…", default)``)."""
    found = re.findall(r"[\"'](GATEWAY_[A-Z0-9_]+)[\"']", GUNICORN_CONF.read_text())
    return list(dict.fromkeys(found))


def settings_rows() -> list[tuple[str, str, str, str]]:
    """Return (variable, default, type, meaning) for every GATEWAY_* setting the gateway reads."""
    defaults = Settings()
    kinds = {f.name: str(f.type) for f in dataclasses.fields(Settings)}
    rows = []
    for env, field in ENV_NAMES.items():
        kind = kinds[field].replace("float | None", "float or unset")
        rows.append((env, _default(getattr(defaults, field)), kind, SETTING_MEANINGS.get(env, "")))
    for env in gunicorn_variables():
        if env in ENV_NAMES:
            continue
        rows.append(
            (env, GUNICORN_DEFAULTS.get(env, "?"), "gunicorn", SETTING_MEANINGS.get(env, ""))
        )
    missing = [env for env, _, _, meaning in rows if not meaning]
    if missing:
        raise SystemExit(f"say what {missing} mean in scripts/gen_docs.py SETTING_MEANINGS")
    return rows


def configuration_table() -> str:
    """Return the markdown table of every setting."""
    lines = ["| variable | default | type | meaning |", "|---|---|---|---|"]
    lines += [
        f"| `{env}` | {default} | {kind} | {meaning} |"
        for env, default, kind, meaning in settings_rows()
    ]
    return "\n".join(lines)


def route_rows() -> list[tuple[str, str, str]]:
    """Return (path as in OpenAPI, methods, summary) for every route of the gateway."""
    app = create_app({"GATEWAY_DEBUG_ENDPOINTS": "1"})
    paths = openapi_document(load_settings({}))["paths"]
    rows = []
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        path = re.sub(r"<(?:[^<>]*:)?(\w+)>", r"{\1}", rule.rule)  # <any(a, b):verb> too
        methods = sorted((rule.methods or set()) - {"HEAD", "OPTIONS"})
        operations = paths.get(path, {})
        summary = next(
            (op.get("summary", "") for m, op in operations.items() if m.upper() in methods), ""
        )
        if not operations:
            summary = (
                summary or "not in the OpenAPI document (off unless `GATEWAY_DEBUG_ENDPOINTS=1`)"
            )
        rows.append((path, ", ".join(methods), summary))
    return rows


def routes_table() -> str:
    """Return the markdown table of every route."""
    lines = ["| route | methods | what it does |", "|---|---|---|"]
    lines += [f"| `{path}` | {methods} | {summary} |" for path, methods, summary in route_rows()]
    return "\n".join(lines)


def openapi_text() -> str:
    """Return the gateway's OpenAPI document under default settings, as committed."""
    return json.dumps(openapi_document(load_settings({})), indent=2, ensure_ascii=False) + "\n"


def gateway_metric_rows() -> list[tuple[str, str, str, str]]:
    """Return (exposed name, type, labels, help) for every metric in backend/metrics.py."""
    rows = []
    for value in vars(gateway_metrics).values():
        kind = getattr(value, "_type", None)
        name = getattr(value, "_name", None)
        if kind is None or name is None or not hasattr(value, "_labelnames"):
            continue
        exposed = f"{name}_total" if kind == "counter" else name
        labels = ", ".join(f"`{label}`" for label in value._labelnames) or "—"
        text = " ".join(value._documentation.split()).replace("|", "\\|")
        rows.append((exposed, kind, labels, text))
    return sorted(rows)


def modelserver_metric_rows() -> list[tuple[str, str, str, str]]:
    """Return (name, type, labels, recorded in) for each metric modelserver/ records.

    Read from the source: every ``inc(NAME, ((label, value), ...))`` and ``observe(...)`` call
    (its Metrics registry names its series at the call, not at declaration).
    """
    names = {}
    tree = ast.parse((MODELSERVER / "metrics.py").read_text())
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant):
            target = statement.targets[0]
            value = str(statement.value.value)
            if isinstance(target, ast.Name) and value.startswith(":tensorflow"):
                names[target.id] = value
    found: dict[str, tuple[str, set[str], set[str]]] = {}
    for path in sorted(MODELSERVER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in ("inc", "observe") or len(node.args) < 2:
                continue
            first = node.args[0]
            if not (isinstance(first, ast.Name) and first.id in names):
                continue
            kind = "counter" if node.func.attr == "inc" else "histogram"
            labels = {
                element.elts[0].value
                for element in getattr(node.args[1], "elts", [])
                if isinstance(element, ast.Tuple) and isinstance(element.elts[0], ast.Constant)
            }
            entry = found.setdefault(names[first.id], (kind, set(), set()))
            entry[1].update(str(label) for label in labels)
            entry[2].add(f"`modelserver/{path.name}`")
    return [
        (
            name,
            kind,
            ", ".join(f"`{label}`" for label in sorted(labels)) or "—",
            ", ".join(sorted(where)),
        )
        for name, (kind, labels, where) in sorted(found.items())
    ]


def metrics_tables() -> tuple[str, str]:
    """Return the gateway's and the model server's metric tables."""
    gateway = ["| metric | type | labels | what it counts |", "|---|---|---|---|"]
    gateway += [f"| `{n}` | {k} | {labels} | {h} |" for n, k, labels, h in gateway_metric_rows()]
    server = ["| metric | type | labels | recorded in |", "|---|---|---|---|"]
    server += [f"| `{n}` | {k} | {labels} | {w} |" for n, k, labels, w in modelserver_metric_rows()]
    return "\n".join(gateway), "\n".join(server)


def script_entry_points() -> list[tuple[str, list[str]]]:
    """Return (command, argv) for every script in scripts/ that takes --help."""
    found = []
    for path in sorted((REPO / "scripts").glob("*.py")):
        found.append((f"python scripts/{path.name}", [f"scripts/{path.name}"]))
    return found


def help_text(argv: list[str]) -> str:
    """Return the --help output of ``python argv``, wrapped at 100 columns, paths relative."""
    env = dict(os.environ, COLUMNS="100", PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, *argv, "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    return out.replace(str(REPO) + "/", "").replace(str(REPO), ".").rstrip() + "\n"


def cli_entry_points() -> list[tuple[str, list[str]]]:
    """Return every command line cli.md documents."""
    return PYTHON_MODULES + script_entry_points()


def all_helps() -> dict[str, str]:
    """Return command -> --help output for cli.md's commands and the model server."""
    commands = [*cli_entry_points(), MODEL_SERVER]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        outputs = pool.map(lambda item: help_text(item[1]), commands)
        return {command: text for (command, _), text in zip(commands, outputs, strict=True)}


# cli.md's second part: what rehearses or measures the stack, and this generator; whoever runs the
# gateway needs none of them
PROJECT_TOOLS = re.compile(
    r"_drill\.py$|scripts/(?:bench|loadtest|profile_gateway|gen_docs)\.py$|-m ops\.(?:load|drills)$"
)
CLI_PARTS = ("Commands a user runs", "Drills, benchmarks and the project's own tools")


def cli_body(helps: dict[str, str]) -> str:
    """Return every command's --help, one section each: the user's commands first."""
    parts: dict[str, list[str]] = {title: [] for title in CLI_PARTS}
    for command, _ in cli_entry_points():
        title = CLI_PARTS[1] if PROJECT_TOOLS.search(command) else CLI_PARTS[0]
        parts[title].append(f"### `{command}`\n\n```text\n{helps[command]}```\n")
    return "\n".join(f"## {title}\n\n" + "\n".join(body) for title, body in parts.items())


def generated_pages(helps: dict[str, str] | None = None) -> dict[Path, str]:
    """Return path -> the text it must have, for every page this script generates."""
    helps = all_helps() if helps is None else helps
    gateway_table, server_table = metrics_tables()
    blocks = {
        REFERENCE / "configuration.md": {"settings": configuration_table()},
        REFERENCE / "http-api.md": {"routes": routes_table()},
        REFERENCE / "metrics.md": {
            "gateway-metrics": gateway_table,
            "modelserver-metrics": server_table,
        },
        REFERENCE / "cli.md": {"cli": cli_body(helps)},
        REFERENCE / "model-server.md": {
            "modelserver-help": f"```text\n{helps[MODEL_SERVER[0]]}```"
        },
    }
    pages = {}
    for path, named in blocks.items():
        text = path.read_text(encoding="utf-8")
        for name, body in named.items():
            text = replace_block(text, name, body)
        pages[path] = text
    pages[REFERENCE / "openapi.json"] = openapi_text()
    pages[runs.SUMMARY] = runs.render_summary(runs.RUNS_DIR)
    return pages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a page is stale"
    )
    args = parser.parse_args()
    stale = []
    for path, text in generated_pages().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(str(path.relative_to(REPO)))
        if not args.check:
            path.write_text(text, encoding="utf-8")
    verb = "stale (run `make docs`)" if args.check else "written"
    print(f"{verb}: {', '.join(stale)}" if stale else "docs: every generated page is current")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Migrate an embedder to a version of another vector space: re-embed the corpus, move the label.

  python -m ops.rollout migrate minilm --to 3 --corpus corpus.jsonl --server tfs:8500
  python -m ops.rollout migrate minilm --rollback      # the label back; both outputs kept

A weighted canary of an embedder whose new version embeds into another space is refused
(``ops.rollout.spaces``): queries of the new space would search a corpus embedded in the old one.
A migration instead:

1. pins the model's default traffic (requests naming no version or label) to the version
   ``--from-label`` names, in the routing file the gateways read: without an entry they would
   send it to the newest AVAILABLE version, V, whose vectors the corpus is not embedded in yet;
2. runs the batch job (``ops.batch``, in process) pinned to ``MODEL@V`` over ``--corpus`` (JSONL or
   Parquet rows of an id and a text) into ``--output``, each of ``--outputs`` (default: every
   output kind V has: dense, sparse, multi-vector) a column group; a migration killed here and run
   again resumes the job where it stopped;
3. checks its output: every input row present once, stamped MODEL@V, each kind of V's own
   dimension, every dense norm finite and above 0, every multi-vector with a row and finite
   values, every sparse weight finite; no error line;
4. reports how the two spaces compare on a sample of the corpus, kind by kind (the rollout's
   space check: ``ops.rollout.spaces``);
5. moves ``--from-label`` to V in one step through push_model's machinery (config lock, label
   history, every replica AVAILABLE, the reader wait), then points default traffic where the
   label points (the routing entry removed when V is the newest version served, else V pinned).
   Nothing is unloaded: the old version stays served until it is retired (push_model), and
   clients that name a version keep it.

A migration that fails puts the routing entry back as it was (none: the old version stays pinned,
the newest AVAILABLE version being V). ``--rollback`` moves the label back to the version it named
before the last migration (from the log), and default traffic with it, and deletes nothing: both
versions' outputs stay where they are. Each step is recorded as a rollout's: the state file
beside the routing file while it runs (a rollout of the same model is refused meanwhile), one
JSON line per event with its figures in ``--log``. Exit status: 0 migrated (or rolled back), 1
error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from backend.errors import GatewayError
from backend.settings import load_settings
from modelformat import serverconfig
from modelformat.errors import FormatError
from modelformat.routing import ModelRoute
from ops.batch.job import parse_kinds
from ops.lifecycle import push
from ops.modelconfig import OpsError, say
from ops.procs import REPO
from ops.rollout.push import promote_with_push
from ops.rollout.spaces import compare, compared_kinds, gateway_embed, output_kinds
from ops.rollout.state import (
    State,
    driving,
    entry_following,
    load_states,
    read_routing,
    restore_route,
    route_to_json,
    routing_path_for,
    state_path_for,
    write_route,
    write_states,
)

MIGRATE = "migrate"  # a migration's ``steps`` in the state file


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Return the parsed arguments."""
    p = argparse.ArgumentParser(
        prog="python -m ops.rollout migrate", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("name", metavar="MODEL", help="the embedder's name in models.config")
    p.add_argument("--to", type=int, help="the new version (AVAILABLE)")
    p.add_argument("--corpus", type=Path, help="JSONL or Parquet rows of an id and a text")
    p.add_argument("--output", type=Path, help="the batch job's folder "
                   "(default results/migrations/MODEL-vV)")  # fmt: skip
    p.add_argument("--id-field", default="id", help="the corpus rows' id field (id)")
    p.add_argument("--text-field", default="text", help="the corpus rows' text field (text)")
    p.add_argument("--outputs", type=parse_kinds, default=None,
                   help="the output kinds to re-embed the corpus in, comma-separated: dense, "
                   "sparse, multivector (default: every kind the new version has)")  # fmt: skip
    p.add_argument("--from-label", default="stable", help="the label to move (stable)")
    p.add_argument("--rollback", action="store_true",
                   help="move the label back to where the last migration found it")  # fmt: skip
    p.add_argument("--sample-rows", type=int, default=200,
                   help="corpus rows the two spaces are compared on (200)")  # fmt: skip
    p.add_argument("--queries", type=int, default=20, help="of them, the sample queries (20)")
    p.add_argument("--server", action="append",
                   help="model server gRPC host:port (repeat per replica; the job uses the "
                   "first); default 127.0.0.1:8500")  # fmt: skip
    p.add_argument("--config", type=Path, default=push.default_config_path(),
                   help="models.config (its lock, labels and label history)")  # fmt: skip
    p.add_argument("--routing", type=Path, default=None,
                   help="the routing file (default: routing.yaml beside --config)")  # fmt: skip
    p.add_argument("--base-path", type=Path, default=REPO / "models",
                   help="the model tree holding <name>/<version>/")  # fmt: skip
    p.add_argument(
        "--log",
        type=Path,
        default=REPO / "results" / "rollouts.jsonl",
        help="append each event here as a JSON line (default results/rollouts.jsonl)",
    )
    p.add_argument(
        "--reader-wait",
        type=float,
        default=None,
        help="seconds for every gateway to read the label (default: push_model's)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait per replica")
    p.add_argument("--lock-timeout", type=float, default=600.0, help="as push_model")
    args = p.parse_args(argv)
    if not args.rollback and (args.to is None or args.corpus is None):
        p.error("--to and --corpus are required (or --rollback)")
    args.server = args.server or ["127.0.0.1:8500"]
    args.routing = args.routing or routing_path_for(args.config)
    if args.output is None and args.to is not None:
        args.output = REPO / "results" / "migrations" / f"{args.name}-v{args.to}"
    if args.reader_wait is None:
        args.reader_wait = push.default_reader_wait_s()
    return args


class Migration:
    """One model's migration (or its rollback), recorded as a rollout's."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.state_path = state_path_for(args.routing)
        # Nothing unloaded: the old version stays served until it is retired (push_model).
        self.promote = promote_with_push(argparse.Namespace(**{**vars(args), "keep": 1 << 20}))

    def labels(self) -> dict[str, int]:
        """Return the model's version labels."""
        try:
            by_model = serverconfig.version_labels(serverconfig.read(self.args.config))
        except FormatError as exc:
            raise OpsError(f"{self.args.config}: {exc}") from exc
        if self.args.name not in by_model:
            raise OpsError(f"model {self.args.name!r} is not in {self.args.config}")
        return by_model[self.args.name]

    def states(self) -> Any:
        """Return the config lock's context (the states are read inside it)."""
        return serverconfig.config_lock(self.args.config, self.args.lock_timeout, say)

    def log(self, event: str, state: State, **figures: Any) -> None:
        """Append one JSON line about ``state`` (and its figures) to the log."""
        record = {
            "time": round(time.time(), 3), "event": event, "model": state.model,
            "version": state.version, "stable": state.stable, "from_label": state.from_label,
            "step": MIGRATE, "phase": state.phase, **figures,
        }  # fmt: skip
        self.args.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.args.log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True, default=str) + "\n")

    def begin(self) -> State:
        """Return the migration's state, recorded (a killed migration's own is resumed)."""
        a = self.args
        with self.states():
            states = load_states(self.state_path)
            existing = states.get(a.name)
            if existing is not None:
                if existing.steps != MIGRATE or existing.version != a.to:
                    raise OpsError(
                        f"a rollout of {a.name} is in progress (v{existing.version}, steps "
                        f"{existing.steps}, {self.state_path}): end it first (--revert)"
                    )
                say(f"resuming the migration of {a.name} to v{a.to}")
                return existing
            labels = self.labels()
            if a.from_label not in labels:
                raise OpsError(f"{a.name} has no label {a.from_label!r}")
            if labels[a.from_label] == a.to:
                raise OpsError(f"v{a.to} is already {a.name}'s {a.from_label}")
            previous = read_routing(a.routing).route(a.name)
            stable = labels[a.from_label]
            state = State(a.name, a.to, a.from_label, stable, MIGRATE, phase="embedding",
                          previous=route_to_json(previous), started_at=time.time(),
                          pid=os.getpid())  # fmt: skip
            states[a.name] = state
            write_states(self.state_path, states)  # before the entry it owns, as a rollout's
            write_route(a.routing, a.name, ModelRoute(((stable, 100.0),)))
        say(f"default traffic of {a.name} (requests naming no version or label) pinned to "
            f"v{stable} until {a.from_label} moves ({a.routing}, read by the gateways within "
            "GATEWAY_LABELS_CACHE_S)")  # fmt: skip
        self.log("start", state, corpus=str(a.corpus), output=str(a.output),
                 previous_route=state.previous)  # fmt: skip
        return state

    def set_phase(self, state: State, phase: str) -> None:
        with self.states():
            states = load_states(self.state_path)
            states[state.model].phase = state.phase = phase
            write_states(self.state_path, states)

    def end(self, state: State, route: ModelRoute | None) -> None:
        """Set the model's routing entry to ``route`` and clear the migration's state."""
        with self.states():
            states = load_states(self.state_path)
            write_route(self.args.routing, state.model, route)
            states.pop(state.model, None)
            write_states(self.state_path, states)

    def run(self) -> dict[str, Any]:
        """Carry the migration out; return its report (the figures of every step)."""
        a = self.args
        with driving(a.routing, a.name):
            state = self.begin()
            try:
                report = self.embed_and_check(state)
            except BaseException as exc:
                if not isinstance(exc, KeyboardInterrupt):
                    route, note = restore_route(state)
                    self.end(state, route)
                    say(f"the migration failed: {note}")
                    self.log("failed", state, reason=str(exc))
                raise
            self.set_phase(state, "moving_label")
            say(f"moving {a.from_label}: v{state.stable} -> v{a.to} (v{state.stable} stays served)")
            self.promote(a.name, a.from_label, a.to)
            route, note = entry_following(a.config, a.name, a.to)
            self.end(state, route)
            say(f"default traffic follows {a.from_label}: {note}")
            report["label"] = {a.from_label: a.to, "was": state.stable}
            report["route"] = route_to_json(route)
            self.log("migrated", state, **report)
            say(f"migrated: {a.from_label}=v{a.to}; the corpus embedded with v{a.to} is in "
                f"{a.output}; roll back with: python -m ops.rollout migrate {a.name} "
                "--rollback")  # fmt: skip
            return report

    def embed_and_check(self, state: State) -> dict[str, Any]:
        """Run the batch job, check its output, compare the spaces; return the figures."""
        from ops.batch.job import JobSpec, run_job

        a = self.args
        settings = load_settings({
            "tfs_grpc_target": a.server[0], "model_base_path": str(a.base_path),
            "model_config_file": str(a.config), "group_in_flight": 0,
            "max_request_rows": 1 << 30, "max_request_tokens": 1 << 40,
        })  # fmt: skip
        gateway, embed_for = gateway_embed(a.server[0], a.base_path, a.config)
        try:
            kinds = a.outputs or output_kinds(gateway, a.name, a.to)
            compared, missing = compared_kinds(gateway, a.name, state.stable, a.to)
        except GatewayError as exc:
            gateway.close()
            raise OpsError(f"cannot read {a.name}'s versions: {exc.message}") from exc
        spec = JobSpec(input=a.corpus, output=a.output, model=f"{a.name}@{a.to}",
                       id_field=a.id_field, text_field=a.text_field, kinds=kinds)  # fmt: skip
        try:
            try:
                summary = run_job(spec, settings, stream=sys.stderr)
            except GatewayError as exc:
                raise OpsError(
                    f"the batch job failed: {exc.message} (run again to resume)"
                ) from exc
            self.log("embedded", state, batch=summary.as_dict())
            say(f"embedded {summary.rows} rows with v{a.to} in {summary.seconds:.1f}s "
                f"({', '.join(kinds)})")  # fmt: skip
            self.set_phase(state, "checking")
            texts = corpus_texts(a.corpus, a.id_field, a.text_field)
            embed = embed_for(a.name)
            try:
                dims = {kind: answer_dim(embed(a.to, ["a"], kind, False), kind) for kind in kinds}
                check = check_output(a.output, list(texts), a.name, a.to, dims)
                self.log("checked", state, output=check)
                say(f"output checked: {check['rows']} rows, {describe_output(check)}")
                sample = list(texts.values())[: a.sample_rows]
                queries = min(a.queries, max(len(sample) - 10, 0))
                spaces = (
                    compare(embed, state.stable, a.to, sample, queries, compared, missing)
                    if queries and compared
                    else None
                )
            except GatewayError as exc:
                raise OpsError(f"the check failed: {exc.message}") from exc
        finally:
            gateway.close()
        if spaces is not None:
            self.log("spaces", state, spaces=spaces.to_json())
            say(f"vector spaces: {spaces.describe()}")
        return {"batch": summary.as_dict(), "output": check,
                "spaces": spaces.to_json() if spaces else None}  # fmt: skip

    def rollback(self) -> dict[str, Any]:
        """Move the label back to where the last migration found it; return what was done."""
        a = self.args
        last = last_migration(a.log, a.name)
        if last is None:
            raise OpsError(f"{a.log} records no migration of {a.name} to roll back")
        label, new, old = last["from_label"], last["version"], last["stable"]
        with driving(a.routing, a.name):
            now = self.labels().get(label)
            if now != new:
                raise OpsError(
                    f"{label} of {a.name} names v{now}, not v{new} the last migration moved it "
                    "to: nothing rolled back"
                )
            say(f"rolling back: {label} v{new} -> v{old} (both outputs kept)")
            self.promote(a.name, label, old)
            route, note = entry_following(a.config, a.name, old)
            with self.states():
                write_route(a.routing, a.name, route)
            say(f"default traffic follows {label}: {note}")
            state = State(a.name, new, label, old, MIGRATE, phase="rolled_back")
            self.log("rolled_back", state, output=last.get("output"))
        return {"label": {label: old}, "was": new, "route": route_to_json(route)}


def corpus_texts(path: Path, id_field: str, text_field: str) -> dict[str, str]:
    """Return the corpus's id -> text (JSONL or Parquet rows)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=[id_field, text_field]).to_pydict()
        return {str(i): str(t) for i, t in zip(table[id_field], table[text_field], strict=True)}
    import orjson

    rows = (orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip())
    return {str(r[id_field]): str(r[text_field]) for r in rows}


def answer_dim(answer: Any, kind: str) -> int:
    """Return the dimension of one text's ``Embed`` answer of ``kind`` (sparse: 0)."""
    if kind == "dense":
        return int(np.shape(answer)[1])
    if kind == "multivector":
        return int(np.shape(answer[0])[1])
    return 0


def check_output(
    folder: Path, ids: Sequence[str], model: str, version: int, dims: dict[str, int]
) -> dict[str, Any]:
    """Return the output's figures; OpsError unless every id is there once, stamped
    ``model@version``, each kind of ``dims`` (kind -> the version's dimension; sparse 0) in its
    columns: dense vectors of that dimension, every norm finite and above 0; multi-vectors of it,
    at least one row each, every value finite; sparse weights finite; no error line."""
    import pyarrow.parquet as pq

    errors = (folder / "errors.jsonl").read_bytes().count(b"\n")
    seen: dict[str, int] = {}
    norms: list[np.ndarray] = []
    problems: list[str] = []
    empty_sparse = empty_multi = bad_values = 0
    for part in sorted(folder.glob("part-*.parquet")):
        table = pq.read_table(part)
        for i in table.column("id").to_pylist():
            seen[i] = seen.get(i, 0) + 1
        stamps = set(zip(table.column("model").to_pylist(), table.column("version").to_pylist(),
                         strict=True))  # fmt: skip
        if stamps - {(model, version)}:
            problems.append(f"{part.name} has rows of {sorted(stamps)}")
        names = set(table.column_names)
        for kind, column in (("dense", "embedding"), ("sparse", "sparse_values"),
                             ("multivector", "token_vectors")):  # fmt: skip
            if kind in dims and column not in names:
                problems.append(f"{part.name} has no {column} column ({kind})")
        if "dense" in dims and "embedding" in names:
            width = table.schema.field("embedding").type.list_size
            if width != dims["dense"]:
                problems.append(f"{part.name}: dimension {width}, v{version} answers "
                                f"{dims['dense']}")  # fmt: skip
            flat = table.column("embedding").combine_chunks().flatten().to_numpy()
            norms.append(np.linalg.norm(flat.reshape(-1, width), axis=1) if width else flat)
        if "sparse" in dims and "sparse_values" in names:
            column = table.column("sparse_values").combine_chunks()
            empty_sparse += int(np.sum(np.diff(column.offsets.to_numpy()) == 0))
            bad_values += int(np.sum(~np.isfinite(column.flatten().to_numpy())))
        if "multivector" in dims and "token_vectors" in names:
            column = table.column("token_vectors").combine_chunks()
            width = column.type.value_type.list_size
            if width != dims["multivector"]:
                problems.append(f"{part.name}: multi-vector dimension {width}, v{version} "
                                f"answers {dims['multivector']}")  # fmt: skip
            empty_multi += int(np.sum(np.diff(column.offsets.to_numpy()) == 0))
            bad_values += int(np.sum(~np.isfinite(column.flatten().flatten().to_numpy())))
    missing = set(ids) - set(seen)
    twice = [i for i, n in seen.items() if n > 1]
    extra = set(seen) - set(ids)
    all_norms = np.concatenate(norms) if norms else np.zeros(0)
    bad_norms = int(np.sum(~np.isfinite(all_norms) | (all_norms <= 0)))
    if errors:
        problems.append(f"{errors} rows failed (errors.jsonl)")
    if missing:
        problems.append(f"{len(missing)} rows missing (e.g. {sorted(missing)[:3]})")
    if twice or extra:
        problems.append(f"{len(twice)} rows twice, {len(extra)} not in the corpus")
    if bad_norms:
        problems.append(f"{bad_norms} vectors of norm 0 or not finite")
    if empty_multi:
        problems.append(f"{empty_multi} multi-vectors without a row")
    if bad_values:
        problems.append(f"{bad_values} sparse or multi-vector values not finite")
    if problems:
        raise OpsError(f"the output in {folder} is not complete: " + "; ".join(problems))
    figures: dict[str, Any] = {"rows": len(seen), "kinds": list(dims), "folder": str(folder)}
    if "dense" in dims:
        figures.update(dim=dims["dense"], norm_min=float(all_norms.min(initial=np.inf)),
                       norm_max=float(all_norms.max(initial=0.0)))  # fmt: skip
    if "multivector" in dims:
        figures["multivector_dim"] = dims["multivector"]
    if "sparse" in dims:
        figures["sparse_empty"] = empty_sparse  # a text none of whose weights is > 0
    return figures


def describe_output(check: dict[str, Any]) -> str:
    """Return the checked output's figures in words."""
    words = []
    if "dim" in check:
        words.append(f"dense dimension {check['dim']}, norms {check['norm_min']:.3f}.."
                     f"{check['norm_max']:.3f}")  # fmt: skip
    if "multivector_dim" in check:
        words.append(f"multi-vector dimension {check['multivector_dim']}")
    if "sparse_empty" in check:
        words.append(f"sparse vectors ({check['sparse_empty']} without an entry)")
    return ", ".join(words)


def last_migration(log: Path, model: str) -> dict[str, Any] | None:
    """Return the log's last ``migrated`` event of ``model`` (None if none)."""
    try:
        lines = log.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        record = json.loads(line)
        if record.get("model") == model and record.get("event") == "migrated":
            return dict(record, output=record.get("output", {}).get("folder"))
        if record.get("model") == model and record.get("event") == "rolled_back":
            return None  # already rolled back (or the migrated version was rolled out and back)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the migration (or its rollback); print its report as JSON; 0 done, 1 error."""
    args = parse_args(argv)
    migration = Migration(args)
    try:
        report = migration.rollback() if args.rollback else migration.run()
    except (OpsError, FormatError) as exc:
        print(f"migrate: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, sort_keys=True, default=str))
    return 0

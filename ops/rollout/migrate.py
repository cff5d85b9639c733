"""Migrate an embedder to a version of another vector space: re-embed the corpus, move the label.

  python -m ops.rollout migrate minilm --to 3 --corpus corpus.jsonl --server tfs:8500
  python -m ops.rollout migrate minilm --rollback      # the label back; both outputs kept

A weighted canary of an embedder whose new version embeds into another space is refused
(``ops.rollout.spaces``): queries of the new space would search a corpus embedded in the old one.
A migration instead:

1. runs the batch job (``ops.batch``, in process) pinned to ``MODEL@V`` over ``--corpus`` (JSONL or
   Parquet rows of an id and a text) into ``--output``; a migration killed here and run again
   resumes the job where it stopped;
2. checks its output: every input row present once, stamped MODEL@V, one dimension (the
   version's own), every norm finite and above 0; no error line;
3. reports how the two spaces compare on a sample of the corpus (mean cosine of the same text,
   top-10 neighbour overlap of sample queries, each version in its own space);
4. moves ``--from-label`` to V in one step through push_model's machinery (config lock, label
   history, every replica AVAILABLE, the reader wait). Nothing is unloaded: the old version stays
   served until it is retired (push_model), and clients that name a version keep it.

``--rollback`` moves the label back to the version it named before the last migration (from the
log) and deletes nothing: both versions' outputs stay where they are. Each step is recorded as a
rollout's: the state file beside the routing file while it runs (a rollout of the same model is
refused meanwhile), one JSON line per event with its figures in ``--log``. Exit status: 0
migrated (or rolled back), 1 error.
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
from ops.lifecycle import push
from ops.modelconfig import OpsError, say
from ops.procs import REPO
from ops.rollout.push import promote_with_push
from ops.rollout.spaces import compare, gateway_embed
from ops.rollout.state import (
    State,
    driving,
    load_states,
    routing_path_for,
    state_path_for,
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
            state = State(a.name, a.to, a.from_label, labels[a.from_label], MIGRATE,
                          phase="embedding", started_at=time.time(), pid=os.getpid())  # fmt: skip
            states[a.name] = state
            write_states(self.state_path, states)
        self.log("start", state, corpus=str(a.corpus), output=str(a.output))
        return state

    def set_phase(self, state: State, phase: str) -> None:
        with self.states():
            states = load_states(self.state_path)
            states[state.model].phase = state.phase = phase
            write_states(self.state_path, states)

    def end(self, state: State) -> None:
        with self.states():
            states = load_states(self.state_path)
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
                    self.end(state)
                    self.log("failed", state, reason=str(exc))
                raise
            self.set_phase(state, "moving_label")
            say(f"moving {a.from_label}: v{state.stable} -> v{a.to} (v{state.stable} stays served)")
            self.promote(a.name, a.from_label, a.to)
            self.end(state)
            report["label"] = {a.from_label: a.to, "was": state.stable}
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
        spec = JobSpec(input=a.corpus, output=a.output, model=f"{a.name}@{a.to}",
                       id_field=a.id_field, text_field=a.text_field)  # fmt: skip
        try:
            summary = run_job(spec, settings, stream=sys.stderr)
        except GatewayError as exc:
            raise OpsError(f"the batch job failed: {exc.message} (run again to resume)") from exc
        self.log("embedded", state, batch=summary.as_dict())
        say(f"embedded {summary.rows} rows with v{a.to} in {summary.seconds:.1f}s")
        self.set_phase(state, "checking")
        texts = corpus_texts(a.corpus, a.id_field, a.text_field)
        gateway, embed_for = gateway_embed(a.server[0], a.base_path, a.config)
        try:
            embed = embed_for(a.name)
            dim = int(embed(a.to, ["a"]).shape[1])
            check = check_output(a.output, list(texts), a.name, a.to, dim)
            self.log("checked", state, output=check)
            say(f"output checked: {check['rows']} rows, dimension {dim}, norms "
                f"{check['norm_min']:.3f}..{check['norm_max']:.3f}")  # fmt: skip
            sample = list(texts.values())[: a.sample_rows]
            queries = min(a.queries, max(len(sample) - 10, 0))
            spaces = compare(embed, state.stable, a.to, sample, queries) if queries else None
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
            state = State(a.name, new, label, old, MIGRATE, phase="rolled_back")
            self.log("rolled_back", state, output=last.get("output"))
        return {"label": {label: old}, "was": new}


def corpus_texts(path: Path, id_field: str, text_field: str) -> dict[str, str]:
    """Return the corpus's id -> text (JSONL or Parquet rows)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=[id_field, text_field]).to_pydict()
        return {str(i): str(t) for i, t in zip(table[id_field], table[text_field], strict=True)}
    import orjson

    rows = (orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip())
    return {str(r[id_field]): str(r[text_field]) for r in rows}


def check_output(
    folder: Path, ids: Sequence[str], model: str, version: int, dim: int
) -> dict[str, Any]:
    """Return the output's figures; OpsError unless every id is there once, stamped
    ``model@version``, of dimension ``dim``, every norm finite and above 0, no error line."""
    import pyarrow.parquet as pq

    errors = (folder / "errors.jsonl").read_bytes().count(b"\n")
    seen: dict[str, int] = {}
    norms: list[np.ndarray] = []
    problems: list[str] = []
    for part in sorted(folder.glob("part-*.parquet")):
        table = pq.read_table(part)
        for i in table.column("id").to_pylist():
            seen[i] = seen.get(i, 0) + 1
        stamps = set(zip(table.column("model").to_pylist(), table.column("version").to_pylist(),
                         strict=True))  # fmt: skip
        if stamps - {(model, version)}:
            problems.append(f"{part.name} has rows of {sorted(stamps)}")
        width = table.schema.field("embedding").type.list_size
        if width != dim:
            problems.append(f"{part.name}: dimension {width}, v{version} answers {dim}")
        flat = table.column("embedding").combine_chunks().flatten().to_numpy()
        norms.append(np.linalg.norm(flat.reshape(-1, width), axis=1) if width else flat)
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
    if problems:
        raise OpsError(f"the output in {folder} is not complete: " + "; ".join(problems))
    return {
        "rows": len(seen), "dim": dim, "norm_min": float(all_norms.min(initial=np.inf)),
        "norm_max": float(all_norms.max(initial=0.0)), "folder": str(folder),
    }  # fmt: skip


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

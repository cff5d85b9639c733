"""Batch jobs (ops/batch/): inputs and errors, Parquet and OpenAI Batch output, resumption after
SIGKILL and after a model-server outage, shards, pacing and progress, against a tiny model server
run with the batching parameters the product ships (serving_config/batching_parameters.txt: 32
rows a call at most, as the `make run` stack, compose and the Kubernetes stack run it)."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from backend.errors import GatewayError
from backend.schemas import EmbedRequest
from backend.service import Gateway
from backend.settings import load_settings
from ops.batch import parts
from ops.batch.inputs import Item
from ops.batch.job import JobSpec, plan_parts, run_job
from ops.batch.pacing import Pacer, Yield
from ops.batch.progress import Progress
from ops.procs import python_cmd
from ops.stack import SERVING_CONFIG
from ops.tfs_metrics import METRICS_PATH, scrape
from tests.backend.conftest import EMBED, INTENT
from tests.backend.stack import ModelServer, model_config

# the model server as the product runs it: batching on, with the shipped parameters
BATCHING = ["--enable_batching=true",
            f"--batching_parameters_file={SERVING_CONFIG / 'batching_parameters.txt'}"]  # fmt: skip

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "while",
    "dogs",
    "ran",
    "past",
    "every",
    "small",
    "house",
    "near",
    "river",
    "bank",
]


def corpus(n: int, seed: int = 0) -> list[str]:
    """Return ``n`` texts of 1 to 40 words (seeded)."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 40))) for _ in range(n)]


def write_rows(path: Path, texts: list[str], extra: list[bytes] = ()) -> Path:  # type: ignore[assignment]
    lines = [orjson.dumps({"id": f"doc-{i}", "text": t}) for i, t in enumerate(texts)]
    path.write_bytes(b"\n".join([*lines, *extra]) + b"\n")
    return path


def batching_server(
    config_file: Path, log_dir: Path, models: tuple[str, ...] = (EMBED, INTENT)
) -> ModelServer:
    """Return a model server with the shipped batching parameters, ``models`` v1 AVAILABLE."""
    server = ModelServer(config_file, log_dir, extra_flags=BATCHING)
    try:
        for model in models:
            server.wait_available(model, 1)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def modelserver(config_file: Path, log_dir: Path) -> Iterator[ModelServer]:
    """The module's model server (the session's runs without batching)."""
    server = batching_server(config_file, log_dir)
    yield server
    server.stop()


def server_env(server: ModelServer, model_base: Path, config_file: Path) -> dict[str, str]:
    """Return the GATEWAY_* variables of a job against ``server``."""
    return {
        "GATEWAY_TFS_GRPC": server.grpc_target,
        "GATEWAY_TFS_REST": server.rest_url,
        "GATEWAY_MODEL_BASE_PATH": str(model_base),
        "GATEWAY_MODEL_CONFIG_FILE": str(config_file),
        "GATEWAY_MAX_TEXT_CHARS": "2000",
    }


@pytest.fixture(scope="module")
def env(modelserver: ModelServer, model_base: Path, config_file: Path) -> dict[str, str]:
    """Return the GATEWAY_* variables of a job against the module's model server."""
    return server_env(modelserver, model_base, config_file)


def settings_of(env: dict[str, str], **overrides: Any) -> Any:
    return load_settings({"max_batch_size": 16, "group_in_flight": 0, **overrides}, environ=env)


def read_parquet(folder: Path) -> dict[str, tuple[np.ndarray, str, int]]:
    """Return id -> (vector, model, version) of every part; fails on a repeated id."""
    rows: dict[str, tuple[np.ndarray, str, int]] = {}
    for path in sorted(folder.glob("part-*.parquet")):
        table = pq.read_table(path).to_pylist()
        for row in table:
            assert row["id"] not in rows, f"{row['id']} twice"
            rows[row["id"]] = (np.asarray(row["embedding"]), row["model"], row["version"])
    return rows


def test_rows_become_parquet_stamped_with_the_version_and_bad_rows_become_error_lines(
    env: dict[str, str], tmp_path: Path
) -> None:
    texts = corpus(40)
    bad = [b"{not json", orjson.dumps({"text": "no id"}), orjson.dumps({"id": "e", "text": " "}),
           orjson.dumps({"id": "long", "text": "x" * 2001})]  # fmt: skip
    source = write_rows(tmp_path / "in.jsonl", texts, bad)
    settings = settings_of(env)

    summary = run_job(JobSpec(source, tmp_path / "out", model=EMBED, part_rows=16), settings,
                      io.StringIO())  # fmt: skip

    rows = read_parquet(tmp_path / "out")
    assert sorted(rows) == sorted(f"doc-{i}" for i in range(40))
    assert {(m, v) for _, m, v in rows.values()} == {(EMBED, 1)}
    online = Gateway(settings)
    try:
        _, want = online.embeddings(EMBED, texts[:5], 1, None)
    finally:
        online.close()
    np.testing.assert_allclose(np.stack([rows[f"doc-{i}"][0] for i in range(5)]), want,
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    errors = [orjson.loads(x) for x in (tmp_path / "out" / "errors.jsonl").read_bytes().split(b"\n")
              if x]  # fmt: skip
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [
        (None, 400), (None, 400), ("e", 422), ("long", 422)]  # fmt: skip
    assert "2000" in errors[3]["response"]["body"]["error"]["message"]
    assert summary.rows == 40 and summary.errors == {"400": 2, "422": 2}
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["models"] == {EMBED: {"model": EMBED, "version": 1}}
    assert manifest["complete"] is True


def test_parquet_rows_with_named_fields_are_read_like_jsonl_rows(
    env: dict[str, str], tmp_path: Path
) -> None:
    import pyarrow as pa

    texts = corpus(12, seed=9)
    table = pa.table({"doc": [f"p{i}" for i in range(12)], "body": texts})
    pq.write_table(table, tmp_path / "in.parquet")
    jsonl = write_rows(tmp_path / "in.jsonl", texts)
    settings = settings_of(env)

    run_job(JobSpec(tmp_path / "in.parquet", tmp_path / "pq", model=f"{EMBED}@1", id_field="doc",
                    text_field="body"), settings, io.StringIO())  # fmt: skip
    run_job(JobSpec(jsonl, tmp_path / "js", model=EMBED), settings, io.StringIO())

    from_parquet, from_jsonl = read_parquet(tmp_path / "pq"), read_parquet(tmp_path / "js")
    assert sorted(from_parquet) == sorted(f"p{i}" for i in range(12))
    for i in range(12):
        np.testing.assert_allclose(from_parquet[f"p{i}"][0], from_jsonl[f"doc-{i}"][0],
                                   rtol=1e-5, atol=1e-6)  # fmt: skip


def batch_line(custom_id: str, url: str, body: Any, method: str = "POST") -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


def test_openai_batch_lines_answer_as_their_routes_and_bad_lines_carry_the_routes_errors(
    env: dict[str, str], tmp_path: Path
) -> None:
    embed_url = f"/v1/models/{EMBED}:embed"
    lines = [
        batch_line("a", "/v1/embeddings", {"model": EMBED, "input": ["hello there", "a cat"]}),
        batch_line("b", embed_url, {"texts": ["the dog ran"], "embedding_types": ["int8"]}),
        batch_line("c", "/v1/embeddings", {"model": f"{EMBED}@1", "input": "one", "dimensions": 4}),
        b"not json",
        batch_line("d", "/v1/chat/completions", {"model": EMBED}),
        batch_line("e", "/v1/embeddings", {"model": EMBED, "input": ["x"] * 300}),
        batch_line("f", "/v1/embeddings", {"model": "no-such-model", "input": "hi"}),
        batch_line("g", f"/v1/models/{INTENT}:embed", {"texts": ["hi"]}),
        batch_line("a", "/v1/embeddings", {"model": EMBED, "input": "again"}),
    ]
    source = tmp_path / "batch.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")

    summary = run_job(JobSpec(source, tmp_path / "out"), settings_of(env), io.StringIO())

    out = {o["custom_id"]: o for o in map(orjson.loads, (tmp_path / "out" / "output.jsonl")
                                          .read_bytes().splitlines())}  # fmt: skip
    assert sorted(out) == ["a", "b", "c"]
    a = out["a"]["response"]["body"]
    assert a["model"] == f"{EMBED}@1" and [d["index"] for d in a["data"]] == [0, 1]
    assert np.linalg.norm(a["data"][0]["embedding"]) == pytest.approx(1.0, abs=1e-5)
    b = out["b"]["response"]["body"]
    assert b["model"] == {"name": EMBED, "version": 1} and "embeddings" not in b
    assert all(isinstance(x, int) for x in b["embeddings_by_type"]["int8"][0])
    assert len(out["c"]["response"]["body"]["data"][0]["embedding"]) == 4
    errors = {e["custom_id"]: e["response"] for e in map(orjson.loads, (
        tmp_path / "out" / "errors.jsonl").read_bytes().splitlines())}  # fmt: skip
    assert {k: v["status_code"] for k, v in errors.items()} == {
        None: 400,
        "d": 404,
        "e": 413,
        "f": 404,
        "g": 422,
        "a": 400,
    }
    assert errors["e"]["body"]["error"]["type"] == "invalid_request_error"  # OpenAI's shape
    assert errors["g"]["body"]["error"]["code"] == "unprocessable"  # :embed's shape
    assert summary.rows == 3 and summary.errors == {"400": 2, "404": 2, "413": 1, "422": 1}


def output_lines(folder: Path) -> dict[str, Any]:
    """Return custom_id -> line of an OpenAI Batch output file."""
    lines = (folder / "output.jsonl").read_bytes().splitlines()
    return {line["custom_id"]: line for line in map(orjson.loads, lines)}


@pytest.mark.parametrize("form", ["rows", "batch"])
def test_either_input_form_writes_either_output_format_with_the_same_vectors(
    env: dict[str, str], tmp_path: Path, form: str
) -> None:
    """Rows as OpenAI Batch output (a /v1/embeddings answer each), OpenAI Batch lines as Parquet
    (``custom_id`` and ``input`` per text), against each form's own default output."""
    texts = corpus(10, seed=4)
    if form == "rows":
        source, model = write_rows(tmp_path / "in.jsonl", texts), EMBED
    else:
        model = None
        lines = [batch_line(f"doc-{i}", "/v1/embeddings", {"model": EMBED, "input": [t, t + " x"]})
                 for i, t in enumerate(texts)]  # fmt: skip
        lines.append(batch_line("dims", "/v1/embeddings", {"model": EMBED, "input": "a",
                                                           "dimensions": 4}))  # fmt: skip
        source = tmp_path / "in.jsonl"
        source.write_bytes(b"\n".join(lines) + b"\n")
    settings = settings_of(env)

    summaries = {}
    for fmt in ("parquet", "openai"):
        spec = JobSpec(source, tmp_path / fmt, model=model, part_rows=4, output_format=fmt)
        summaries[fmt] = run_job(spec, settings, io.StringIO())

    answers = output_lines(tmp_path / "openai")
    tables = [pq.read_table(p) for p in sorted((tmp_path / "parquet").glob("part-*.parquet"))]
    rows = [row for table in tables for row in table.to_pylist()]
    assert {(row["model"], row["version"]) for row in rows} == {(EMBED, 1)}
    if form == "rows":
        assert sorted(answers) == sorted(row["id"] for row in rows) == sorted(
            f"doc-{i}" for i in range(10))  # fmt: skip
        assert "input" not in tables[0].column_names
        body = answers["doc-3"]["response"]["body"]
        assert body["model"] == f"{EMBED}@1" and body["usage"]["prompt_tokens"] > 0
        got = {row["id"]: row["embedding"] for row in rows}
        np.testing.assert_allclose(body["data"][0]["embedding"], got["doc-3"], rtol=1e-5, atol=1e-6)
        assert summaries["parquet"].rows == summaries["openai"].rows == 10
    else:
        assert tables[0].column_names == ["id", "input", "embedding", "model", "version"]
        got = {(row["id"], row["input"]): row["embedding"] for row in rows}
        assert len(got) == 20 and summaries["parquet"].rows == 20
        for i in range(10):
            data = answers[f"doc-{i}"]["response"]["body"]["data"]
            for k in range(2):
                np.testing.assert_allclose(got[(f"doc-{i}", k)], data[k]["embedding"], rtol=1e-5,
                                           atol=1e-6)  # fmt: skip
        errors = [orjson.loads(x) for x in (tmp_path / "parquet" / "errors.jsonl").read_bytes()
                  .splitlines()]  # fmt: skip
        assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("dims", 422)]
        assert "--output-format openai" in errors[0]["response"]["body"]["error"]["message"]
        assert len(answers["dims"]["response"]["body"]["data"][0]["embedding"]) == 4


def test_parquet_outputs_a_model_lacks_are_refused_for_its_rows(
    env: dict[str, str], tmp_path: Path
) -> None:
    source = write_rows(tmp_path / "in.jsonl", corpus(3))

    summary = run_job(JobSpec(source, tmp_path / "out", model=EMBED, kinds=("dense", "sparse")),
                      settings_of(env), io.StringIO())  # fmt: skip

    assert summary.rows == 0 and summary.errors == {"422": 3}
    line = orjson.loads((tmp_path / "out" / "errors.jsonl").read_bytes().splitlines()[0])
    assert "has no sparse output (its outputs: dense)" in line["response"]["body"]["error"][
        "message"]  # fmt: skip


def test_three_shards_together_write_the_rows_of_one_run(
    env: dict[str, str], tmp_path: Path
) -> None:
    source = write_rows(tmp_path / "in.jsonl", corpus(50, seed=3))
    settings = settings_of(env)
    run_job(JobSpec(source, tmp_path / "one", model=EMBED, part_rows=8), settings, io.StringIO())
    for index in range(3):
        spec = JobSpec(source, tmp_path / "three", model=EMBED, part_rows=8, shard=(index, 3))
        run_job(spec, settings, io.StringIO())

    one, three = read_parquet(tmp_path / "one"), read_parquet(tmp_path / "three")
    assert sorted(one) == sorted(three) and len(one) == 50
    for key, (vector, _, _) in one.items():
        np.testing.assert_allclose(three[key][0], vector, rtol=1e-5, atol=1e-6)


def test_a_job_killed_at_random_points_and_run_again_writes_each_row_once(
    env: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL at seeded random moments, several times; the restarted job's rows are exactly an
    uninterrupted run's."""
    # 80 parts of 8 rows; the last kill's target is at most part 35, so the job has 45 parts to go
    # (with 320 rows it had 5, and a fast tiny model once wrote them all before its kill landed)
    rows = 640
    source = write_rows(tmp_path / "in.jsonl", corpus(rows, seed=5))
    flags = [
        "--model",
        EMBED,
        "--part-rows",
        "8",
        "--call-rows",
        "8",
        "--max-batch",
        "8",
        "--yield-ratio",
        "0",
    ]  # resumption, not the yield: the calls as given, no probes
    run_job(JobSpec(source, tmp_path / "whole", model=EMBED, part_rows=8, call_rows=8),
            settings_of(env, max_batch_size=8), io.StringIO())  # fmt: skip
    cmd = python_cmd("-m", "ops.batch", str(source), "--output", str(tmp_path / "killed"), *flags)
    rng = random.Random(51)
    kills, written = 0, []
    for round_ in range(4):  # each kill lands after a seeded number of parts, at a random moment
        target = round_ * 9 + rng.randint(1, 8)
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        while proc.poll() is None and parts_in(tmp_path / "killed") < target:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.05))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        written.append(parts_in(tmp_path / "killed"))
    done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    whole, killed = read_parquet(tmp_path / "whole"), read_parquet(tmp_path / "killed")
    assert kills == 4 and written[-1] < rows // 8, "the job ended before a kill: make it longer"
    assert sorted(killed) == sorted(whole) and len(whole) == rows
    assert json.loads(done.stdout)["rows"] == rows
    for key, (vector, _, _) in whole.items():
        np.testing.assert_allclose(killed[key][0], vector, rtol=1e-5, atol=1e-6)
    print(f"\nkills: {kills}, parts after each: {written}, rows: {len(killed)}, missing: 0, "
          "twice: 0")  # fmt: skip


def parts_in(folder: Path) -> int:
    """Return how many Parquet parts are in place in ``folder``."""
    return len(list(folder.glob("part-*.parquet")))


def test_parts_are_sorted_by_size_and_never_split_an_item() -> None:
    items = [Item(i, str(i), "rows", "m", ["x" * n]) for i, n in enumerate([5, 1, 3, 1, 9])]

    planned = plan_parts(items, 2)

    assert [[i.index for i in part] for part in planned] == [[1, 3], [2, 0], [4]]


def test_the_pacer_halves_its_duty_when_calls_slow_and_grows_it_back() -> None:
    pacer = Pacer(slow_ratio=1.5, step=0.25)
    assert pacer.after_call(0.1, 10, 100) == 0.0  # the quiet baseline: back to back
    pause = pacer.after_call(0.3, 10, 100)  # 3x slower per token: online traffic is there
    assert pacer.duty == 0.5 and pause == pytest.approx(0.3)
    pacer.after_call(0.1, 10, 100)
    assert pacer.duty == 0.75
    capped = Pacer(max_rows_per_s=100)
    assert capped.after_call(0.05, 10, 100) == pytest.approx(0.05)


def test_the_yield_waits_while_probes_are_slower_than_quiet_doubling_its_waits() -> None:
    rule = Yield(ratio=1.2, first=3, first_wait_s=0.05, max_wait_s=0.3)
    probes = iter([0.010, 0.012, 0.009, 0.0115, 0.030, 0.025, 0.020, 0.020, 0.0119])
    slept: list[float] = []

    rule.wait(lambda: next(probes), slept.append)  # the first three: the baseline, quiet
    rule.wait(lambda: next(probes), slept.append)
    rule.wait(lambda: next(probes), slept.append)
    rule.wait(lambda: next(probes), slept.append)  # 1.15x the median: quiet
    rule.wait(lambda: next(probes), slept.append)  # busy until the 1.19x probe

    assert rule.baseline == 0.010 and slept == [0.05, 0.1, 0.2, 0.3]
    assert rule.probes == 9 and rule.waited_s == pytest.approx(0.65)
    rule.size(0.04, 16, 512)  # 16 rows in 4x the probe: 32 (at most doubling) toward 8x
    assert rule.rows == 32
    rule.size(0.16, 32, 512)  # 16x the probe: half as many
    assert rule.rows == 16
    # a server never quiet: one call goes after the patience (the job is never starved)
    patient = Yield(ratio=1.2, first=1, first_wait_s=0.05, max_wait_s=0.3, patience_s=1.0)
    patient.wait(lambda: 0.010, slept.append)
    slept.clear()
    patient.wait(lambda: 0.100, slept.append)
    assert sum(slept) >= 1.0 and patient.forced == 1


def test_the_yield_by_requests_sends_only_after_a_window_with_no_one_elses_request() -> None:
    server = {"count": 10.0}  # the model server's answered requests, everyone's
    now = {"t": 0.0}

    def sleep(seconds: float) -> None:
        now["t"] += seconds
        server["count"] += online.pop(0) if online else 0  # others' requests while it slept

    rule = Yield(count=lambda: server["count"], window_s=1.0, first_wait_s=0.25, max_wait_s=0.25)
    online: list[float] = []
    rule.wait(None, sleep, lambda: now["t"])  # the first reading starts the window: 1 s
    assert now["t"] == 1.0 and rule.rule == "requests"
    rule.own += 3  # the job's own call: three Predicts, answered
    server["count"] += 3
    rule.wait(None, sleep, lambda: now["t"])  # only the job's: no wait
    assert now["t"] == 1.0
    server["count"] += 1  # someone else's request
    online[:] = [2, 0, 1, 0, 0, 0, 0]  # and more while the job waits
    rule.wait(None, sleep, lambda: now["t"])
    assert now["t"] == 1.0 + 0.25 * 3 + 1.0  # the window restarts at the last one it saw
    assert rule.waited_s == pytest.approx(2.75) and rule.forced == 0
    # traffic that never stops: one call after the patience
    rule.patience_s, online[:] = 1.0, [1] * 20
    server["count"] += 1
    rule.wait(None, sleep, lambda: now["t"])
    assert rule.forced == 1


def test_the_job_sends_nothing_while_someone_else_calls_the_model_server(
    env: dict[str, str], modelserver: ModelServer, tmp_path: Path
) -> None:
    """The default rule, by the server's request count: a job started during another client's
    traffic waits until it stops (nothing forced), then runs; its summary says so."""
    source = write_rows(tmp_path / "in.jsonl", corpus(48, seed=7))
    gateway = Gateway(settings_of(env))
    stop, online = threading.Event(), {"calls": 0}

    def client() -> None:
        while not stop.is_set():
            gateway.embed(EMBED, EmbedRequest(texts=["someone else's query"]))
            online["calls"] += 1

    thread = threading.Thread(target=client)
    thread.start()
    cmd = python_cmd("-m", "ops.batch", str(source), "--output", str(tmp_path / "out"),
                     "--model", EMBED, "--max-batch", "8", "--quiet-window", "0.5")  # fmt: skip
    job_env = {**os.environ, **env, "GATEWAY_TFS_REST": modelserver.rest_url}
    proc = subprocess.Popen(cmd, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:  # the job's start-up (its manifest: specs resolved, parts planned), then 3 s of its wait
        deadline = time.monotonic() + 60
        while not (tmp_path / "out" / parts.MANIFEST).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3.0)
        assert proc.poll() is None, proc.communicate()
        assert not list((tmp_path / "out").glob("part-*.parquet")), "a part while online ran"
    finally:
        stop.set()
        thread.join()
        gateway.close()
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["rows"] == 48 and online["calls"] > 50
    assert summary["yield"]["rule"] == "requests" and summary["yield"]["forced"] == 0
    assert summary["yield"]["waited_s"] > 1.0


def test_progress_writes_plain_lines_with_rate_and_time_left_off_a_terminal() -> None:
    stream = io.StringIO()
    progress = Progress(100, stream=stream, every_s=0)
    progress.add(50)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("50/100 rows")
    assert "rows/s" in lines[0] and "left" in lines[0]


def model_server_requests(server: ModelServer) -> float:
    """Return the requests the model server has answered (its Prometheus page), every model's."""
    return float(sum((scrape(server.rest_url + METRICS_PATH) or {}).values()))


def test_the_job_with_default_flags_sends_calls_the_shipped_batching_limit_takes(
    env: dict[str, str], modelserver: ModelServer, tmp_path: Path
) -> None:
    """``python -m ops.batch`` as the guide types it (no sizing flags), against the model server
    run with serving_config's batching parameters: every call fits (none refused, none retried
    row by row), so the model server answers a few calls of up to 32 rows, not one per row."""
    rows = 100
    source = write_rows(tmp_path / "in.jsonl", corpus(rows, seed=11))
    cmd = python_cmd("-m", "ops.batch", str(source), "--output", str(tmp_path / "out"),
                     "--model", EMBED)  # fmt: skip
    before = model_server_requests(modelserver)

    done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)  # fmt: skip

    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["rows"] == rows and summary["error_lines"] == 0
    assert summary["refused_calls"] == 0, done.stderr[-3000:]
    assert "refuses" not in done.stderr
    # 100 rows in calls of <= 32 per length bucket and the yield's probes (7): well under one
    # call per row (the old default: each call refused, retried, then sent a row a call)
    assert model_server_requests(modelserver) - before < rows // 2
    assert len(read_parquet(tmp_path / "out")) == rows


def test_a_call_over_the_model_servers_batching_limit_is_sent_again_at_its_limit_and_said(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-batch 64 against a model server whose batching takes 32: the first refusal is said
    on stderr and counted, the job's calls take the limit it names, nothing is retried as it
    was, and every row is written (none an error line)."""
    source = write_rows(tmp_path / "in.jsonl", corpus(80, seed=12))

    summary = run_job(JobSpec(source, tmp_path / "out", model=EMBED),
                      settings_of(env, max_batch_size=64), io.StringIO())  # fmt: skip

    said = capsys.readouterr().err
    assert summary.rows == 80 and summary.errors == {}
    assert summary.refused_calls == 1 and summary.as_dict()["refused_calls"] == 1
    assert "refuses calls of more than 32 rows" in said and "--max-batch 32" in said
    assert len(read_parquet(tmp_path / "out")) == 80


def test_a_part_whose_every_row_fails_is_written_with_the_models_columns(
    env: dict[str, str], tmp_path: Path
) -> None:
    """OpenAI Batch :embed lines as Parquet, the long ones with truncate false: their part has
    no row to write (each a 422 error line), and is written anyway, with the dimension of the
    other parts' vectors, so the job ends (it died at that part on every rerun)."""
    url = f"/v1/models/{EMBED}:embed"
    short = [batch_line(f"s{i}", url, {"texts": [t]}) for i, t in enumerate(corpus(4, seed=2))]
    long = [batch_line(f"l{i}", url, {"texts": [" ".join(["house"] * (300 + i))],
                                      "truncate": False}) for i in range(4)]  # fmt: skip
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join([*short, *long]) + b"\n")

    summary = run_job(JobSpec(source, tmp_path / "out", part_rows=4, output_format="parquet"),
                      settings_of(env), io.StringIO())  # fmt: skip

    assert summary.rows == 4 and summary.errors == {"422": 4} and summary.parts == 2
    tables = [pq.read_table(tmp_path / "out" / parts.part_name(k, "parquet")) for k in (0, 1)]
    assert [t.num_rows for t in tables] == [4, 0]
    assert tables[1].schema == tables[0].schema  # the embedding column: the model's dimension
    errors = (tmp_path / "out" / "errors.jsonl").read_bytes().splitlines()
    assert sorted(orjson.loads(e)["custom_id"] for e in errors) == ["l0", "l1", "l2", "l3"]


@pytest.mark.parametrize("missing", ["errors.jsonl", "parquet", "done"])
def test_a_part_with_one_of_its_files_missing_is_run_again_whole(
    env: dict[str, str], tmp_path: Path, missing: str
) -> None:
    """The states a kill between a part's writes leaves, made on purpose: its errors file, its
    output or its marker missing. The rerun runs that part again (a new file in place), and the
    rows are each there once."""
    source = write_rows(tmp_path / "in.jsonl", corpus(24, seed=13))
    settings = settings_of(env)
    out = tmp_path / "out"
    run_job(JobSpec(source, out, model=EMBED, part_rows=8), settings, io.StringIO())
    before = (out / parts.part_name(1, "parquet")).stat().st_ino
    (out / parts.part_name(1, missing)).unlink(missing_ok=True)

    summary = run_job(JobSpec(source, out, model=EMBED, part_rows=8), settings, io.StringIO())

    assert all((out / parts.part_name(1, ext)).exists() for ext in ("parquet", "errors.jsonl"))
    assert (out / parts.part_name(1, "parquet")).stat().st_ino != before, "part 1 not run again"
    assert summary.rows == 24 and summary.errors == {}
    assert sorted(read_parquet(out)) == sorted(f"doc-{i}" for i in range(24))


def test_a_job_stopped_by_a_model_server_outage_resumes_with_every_row_once(
    env: dict[str, str], model_base: Path, config_file: Path, log_dir: Path, tmp_path: Path
) -> None:
    """The model server stopped for real while the job runs: the job stops (no 503 error lines,
    no part written for the rows it could not send) and raises; run again against the model
    server started anew, it ends with exactly the rows of an uninterrupted run."""
    rows = 400
    source = write_rows(tmp_path / "in.jsonl", corpus(rows, seed=14))
    settings = settings_of(env)
    run_job(JobSpec(source, tmp_path / "whole", model=EMBED, part_rows=8), settings, io.StringIO())
    config_file = tmp_path / "embed.config"  # tiny-embed alone: a cheaper start, twice
    config_file.write_text(model_config(model_base, {}, [EMBED]), encoding="utf-8")
    server = batching_server(config_file, log_dir, (EMBED,))
    job_settings = settings_of(server_env(server, model_base, config_file))
    out = tmp_path / "out"
    slow = JobSpec(source, out, model=EMBED, part_rows=8, call_rows=8, retries=1, backoff_s=0.1,
                   pacer=Pacer(slow_ratio=float("inf"), max_rows_per_s=100))  # fmt: skip
    failure: list[BaseException] = []

    def job() -> None:
        try:
            run_job(slow, job_settings, io.StringIO())
        except BaseException as exc:  # the test reads it
            failure.append(exc)

    thread = threading.Thread(target=job)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while parts_in(out) < 3 and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        server.stop()
    thread.join(timeout=120)
    written = parts_in(out)
    assert failure and isinstance(failure[0], GatewayError), failure
    assert failure[0].status_code in (503, 504), failure[0]
    assert 3 <= written < rows // 8, "the job ended before the outage: make it longer"
    errors = b"".join(p.read_bytes() for p in out.glob("part-*.errors.jsonl"))
    assert errors == b"", "the outage became error lines"

    again = batching_server(config_file, log_dir, (EMBED,))
    try:
        summary = run_job(JobSpec(source, out, model=EMBED, part_rows=8, call_rows=8),
                          settings_of(server_env(again, model_base, config_file)),
                          io.StringIO())  # fmt: skip
    finally:
        again.stop()

    whole, resumed = read_parquet(tmp_path / "whole"), read_parquet(out)  # fails on a row twice
    assert sorted(resumed) == sorted(whole) and len(resumed) == rows
    assert summary.rows == rows and summary.errors == {}
    for key, (vector, _, _) in whole.items():
        np.testing.assert_allclose(resumed[key][0], vector, rtol=1e-5, atol=1e-6)
    print(f"\noutage after {written} of {rows // 8} parts; resumed: rows {len(resumed)}, "
          f"lost {rows - len(resumed)}, twice 0")  # fmt: skip


def test_a_shard_holds_only_its_own_parts_a_window_at_a_time(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shard 1 of 3 reads back only the lines of its own parts, at most HOLD_ROWS inputs at a
    time (the plan itself holds numbers, not texts)."""
    from ops.batch import job as job_module
    from ops.batch import plan as plan_module

    source = write_rows(tmp_path / "in.jsonl", corpus(60, seed=15))
    held: list[list[str]] = []

    def load(*args: Any) -> dict[int, list[Item]]:
        loaded = plan_module.load(*args)
        held.append([item.custom_id for items in loaded.values() for item in items])
        return loaded

    monkeypatch.setattr(plan_module, "HOLD_ROWS", 16)
    monkeypatch.setattr(job_module, "load", load)
    spec = JobSpec(source, tmp_path / "out", model=EMBED, part_rows=8, shard=(1, 3))

    run_job(spec, settings_of(env), io.StringIO())

    own = read_parquet(tmp_path / "out")
    assert len(held) > 1 and all(len(ids) <= 16 for ids in held)
    assert sorted(i for ids in held for i in ids) == sorted(own)
    assert 0 < len(own) < 60


def test_the_progress_line_comes_every_period_while_no_call_ends() -> None:
    stream = io.StringIO()
    progress = Progress(100, stream=stream, every_s=0.05)
    progress.start()
    time.sleep(0.3)  # a slow call: nothing added
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 4 and all(line.startswith("0/100 rows") for line in lines)

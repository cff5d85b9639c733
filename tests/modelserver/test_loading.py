"""A version loads beside the serving ones: on its own lower-priority thread, warmup paced."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

import modelserver.server as server_module
from modelserver.flags import parse_flags
from modelserver.loading import on_load_thread
from modelserver.metrics import Metrics
from modelserver.server import ModelServer, make_loader
from modelserver.warmup import WARMUP_FILE, read_tfrecords, run_warmup
from ops.procs import free_port


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_a_load_runs_on_its_own_thread_at_a_lower_priority_and_leaves_the_callers_alone() -> None:
    before = _nice()
    seen = on_load_thread(lambda: (threading.current_thread().name, _nice()), 5, name="load-7")
    assert seen == ("load-7", min(19, before + 5))
    assert _nice() == before


def test_a_failed_load_raises_in_the_caller() -> None:
    def broken() -> None:
        raise ValueError("bad saved_model.pb")

    with pytest.raises(ValueError, match="bad saved_model"):
        on_load_thread(broken, 5)


class SlowServable:
    """Stands in for a LoadedVersion: each run takes ``run_s``."""

    def __init__(self, path: Path, run_s: float) -> None:
        self.path, self.run_s, self.runs = path, run_s, 0

    def plan(self, signature: str, inputs: object, output_filter: object) -> str:
        return signature

    def run(self, plan: str) -> None:
        self.runs += 1
        time.sleep(self.run_s)


def _write_records(version: Path, count: int) -> None:
    path = version / WARMUP_FILE
    path.parent.mkdir(parents=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(count):
            entry = prediction_log_pb2.PredictionLog()
            request = entry.predict_log.request
            request.model_spec.signature_name = "serving_default"
            request.inputs["input_ids"].CopyFrom(tf.make_tensor_proto([[101, 102]], tf.int64))
            writer.write(entry.SerializeToString())


@pytest.mark.parametrize(("duty", "pause_per_run"), [(0.5, 1.0), (0.25, 3.0), (1.0, None)])
def test_warmup_pauses_after_each_record_to_keep_its_share_of_the_time(
    tmp_path: Path, duty: float, pause_per_run: float | None
) -> None:
    _write_records(tmp_path, 3)
    servable = SlowServable(tmp_path, run_s=0.02)
    pauses: list[float] = []

    assert run_warmup(servable, 1, duty_cycle=duty, sleep=pauses.append) == 3  # type: ignore[arg-type]

    if pause_per_run is None:
        assert pauses == []  # back to back, as TF Serving replays them
    else:
        assert len(pauses) == 3
        # each pause is the record's own run time (at least run_s) times 1 / duty - 1
        assert all(pause >= 0.02 * pause_per_run for pause in pauses)


def test_the_load_flags_default_to_serving_first_and_refuse_a_duty_cycle_out_of_range() -> None:
    flags = parse_flags([])
    assert flags.load_nice > 0 and 0 < flags.warmup_duty_cycle < 1
    with pytest.raises(SystemExit):
        parse_flags(["--warmup_duty_cycle", "0"])


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a base path holding tiny/1, a classifier with its warmup records."""
    from export.tiny import export_tiny_model

    base = tmp_path_factory.mktemp("loading")
    export_tiny_model(base, "tiny", task="classify", version=1, seed=0, max_seq_len=16)
    return base


def test_warmup_runs_back_to_back_until_the_server_serves_and_paced_after(tiny_base: Path) -> None:
    version = tiny_base / "tiny" / "1"
    records = sum(1 for _ in read_tfrecords(version / WARMUP_FILE))
    serving, pauses = threading.Event(), list[float]()
    load = make_loader(parse_flags([]), Metrics(), serving, sleep=pauses.append)

    load(version)
    assert pauses == []  # nothing is served yet: no request waits for the pool

    serving.set()
    load(version)
    assert len(pauses) == records > 0


def test_the_initial_load_comes_before_serving_and_a_later_version_loads_beside_it(
    tiny_base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spy on the loader records whether the server counted as serving at each load."""
    base = tmp_path / "tiny"
    shutil.copytree(tiny_base / "tiny" / "1", base / "1")
    seen: list[tuple[str, bool]] = []
    real = server_module.make_loader

    def spy(flags: Any, metrics: Metrics, serving: threading.Event) -> Callable[[Path], Any]:
        load = real(flags, metrics, serving)

        def spied(path: Path) -> Any:
            seen.append((path.name, serving.is_set()))
            return load(path)

        return spied

    monkeypatch.setattr(server_module, "make_loader", spy)
    flags = parse_flags(["--port", str(free_port()), "--model_name=tiny",
                         f"--model_base_path={base}"])  # fmt: skip
    server = ModelServer(flags)
    try:
        server.start()
        assert seen == [("1", False)] and server.serving.is_set()
        shutil.copytree(base / "1", base / "2")  # the file-system poll finds it
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert seen[1:] == [("2", True)]
    finally:
        server.stop()


def _threads(pid: int) -> dict[int, tuple[int, int]]:
    """Return ``{tid: (nice, CPU ticks)}`` of every thread of process ``pid``."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        found[int(task.name)] = (int(fields[16]), int(fields[11]) + int(fields[12]))
    return found


def test_requests_are_served_by_threads_at_normal_priority_after_a_lowered_load(
    tmp_path: Path,
) -> None:
    # Threads inherit their creator's nice value: had TensorFlow made its pools during the first
    # load (on a lowered thread), every request would run at the load's priority ever after.
    import requests

    from export.tiny import export_tiny_model
    from tests.backend.stack import ModelServer

    export_tiny_model(tmp_path / "models", "tiny", task="classify", version=1, seed=0)
    config = tmp_path / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "tiny" base_path: "{tmp_path / "models" / "tiny"}" '
        'model_platform: "tensorflow" } }\n'
    )
    server = ModelServer(config, tmp_path)
    try:
        server.wait_available("tiny", 1)
        pid = server.process.pid
        meta = requests.get(f"{server.rest_url}/v1/models/tiny/metadata", timeout=30).json()
        sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
        body = {"inputs": {name: [[1] * 64] * 8 for name in sig["inputs"]}}
        before = _threads(pid)
        for _ in range(100):
            url = f"{server.rest_url}/v1/models/tiny:predict"
            reply = requests.post(url, json=body, timeout=30)
            assert reply.status_code == 200, reply.text
        after = _threads(pid)
    finally:
        server.stop()
    normal = before[pid][0]
    busy_lowered = {
        tid: ticks - before.get(tid, (0, 0))[1]
        for tid, (nice, ticks) in after.items()
        if nice != normal and ticks > before.get(tid, (0, 0))[1]
    }
    assert not busy_lowered, f"lowered threads served requests (tid: CPU ticks): {busy_lowered}"

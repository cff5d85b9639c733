"""modelserver's own behaviour where TF Serving's binary differs, so the contract suite (which
runs either server, TFS_BIN naming the binary) leaves it out: each test says what the binary does.
"""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from tests.contract.conftest import (
    Server,
    base_models,
    cpu_seconds,
    start_server,
    wait_until_spinning,
    write_config,
)
from tests.contract.test_lifecycle import predict, reload, wait_for, y_of
from tests.contract.test_startup import version_available


def test_config_polling_applies_an_edit_while_a_missing_model_is_still_awaited(
    tmp_path: Path, hp2_base: Path
) -> None:
    """TF Serving's poller holds the next config edit until a missing model appears (it waits
    for it forever); modelserver applies the edit while the first model is still awaited."""
    config = tmp_path / "models.config"
    a = {"name": "a", "base_path": str(hp2_base)}
    ghost = {"name": "ghost", "base_path": str(tmp_path / "nowhere")}
    b = {"name": "b", "base_path": str(hp2_base)}
    write_config(config, [a])
    server = start_server(
        tmp_path, [f"--model_config_file={config}", "--model_config_file_poll_wait_seconds=1"]
    )
    try:
        write_config(config, [a, ghost])
        server.proc.wait_until(
            lambda: "for servable ghost" in server.proc.log_path.read_text(errors="replace"), 30
        )
        write_config(config, [a, b])  # the fix for the typo, while the first edit still waits

        # Well inside the 300 s the reload of the first edit may wait for its model.
        server.proc.wait_until(lambda: version_available(server, "b", 2), 60)
    finally:
        server.stop()


def test_a_reload_waiting_for_a_missing_model_does_not_hold_up_the_next(
    life_server: Server, life_root: Path
) -> None:
    """TF Serving's HandleReloadConfigRequest holds one lock (ServerCore's config mutex) while it
    waits, with no deadline by default, for the models it added to become available, so a
    second reload waits behind one whose model never appears; modelserver waits without a lock,
    and the second reload, which drops that model, lets the first one return too."""
    ghost = {"name": "ghost2", "base_path": str(life_root / "nowhere2")}

    def polled_ghost() -> bool:  # the server has the first config and looks for the model
        log = life_server.proc.log_path.read_text(errors="replace")
        return f"for servable {ghost['name']}" in log

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(reload, life_server, [*base_models(life_root), ghost], 120)
        wait_for(polled_ghost)
        reload(life_server, base_models(life_root), timeout=20)  # not stuck behind the first
        waiting.result(timeout=30)  # its model left the config: nothing left to wait for

    assert not waiting.exception()
    assert y_of(predict(life_server, "steady")) > 0


def test_sigterm_lets_in_flight_requests_finish(tmp_path: Path, hp2_base: Path) -> None:
    """modelserver drains the requests in flight on SIGTERM: its own shutdown, not a behaviour of
    TF Serving's binary that the contract suite holds it to."""
    server = start_server(tmp_path, [f"--model_base_path={hp2_base}", "--model_name=m"])
    body = {"signature_name": "slow", "inputs": {"x": [[1.0]], "seconds": [1.5]}}
    try:
        with ThreadPoolExecutor(1) as pool:
            before = cpu_seconds(server)
            in_flight = pool.submit(
                requests.post, server.url + "/v1/models/m:predict", json=body, timeout=30
            )
            wait_until_spinning(server, before)
            server.proc.proc.send_signal(signal.SIGTERM)
            reply = in_flight.result()
        assert reply.json() == {"outputs": [[3.5]]}
        assert server.proc.proc.wait(timeout=10) == 0
    finally:
        server.stop()


def test_warmup_replay_runs_each_record_on_its_named_signature(
    tiny_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """modelserver's loader replays each warmup record on the signature it names: the test calls
    that loader in process (LoadedVersion, run_warmup); the binary's loader is C++ and replays
    without a signature spy to watch it."""
    from modelserver.servable import LoadedVersion
    from modelserver.warmup import run_warmup

    servable = LoadedVersion(tiny_base / "1")
    seen: list[tuple[str, int]] = []
    real_run = servable.run

    def spy(plan: Any) -> dict[str, np.ndarray]:
        seen.append((plan.signature_name, plan.inputs["input_ids"].shape[1]))
        return real_run(plan)

    monkeypatch.setattr(servable, "run", spy)
    count = run_warmup(servable)

    assert count == len(seen)
    bucketed = {(sig, seq) for sig, seq in seen if sig != "serving_default"}
    assert bucketed == {("seq_16", 16), ("seq_32", 32), ("seq_64", 64)}

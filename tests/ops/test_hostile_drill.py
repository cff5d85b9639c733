"""The hostile drill, run tiny on tiny exports (real processes): every attack runs against paced
well-behaved clients, none of whose requests fails; restarts under keep-alive load lose none."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.drills import hostile as hostile_drill
from tests.ops.conftest import MODEL
from tests.ops.test_drills import run_drill


def test_the_stalled_attack_sends_a_half_of_every_part_of_a_request() -> None:
    from backend.httpworker import request_complete

    for half in hostile_drill.HALVES:  # none is a whole request the gateway could serve
        assert not request_complete(half, max_head=65536, max_body=1_048_576), half


@pytest.mark.slow
def test_hostile_drill_fails_no_well_behaved_request(tiny_exports: Path, tmp_path: Path) -> None:
    code, result, output = run_drill(
        "hostile_drill.py", tmp_path / "hostile.json", "--spawn", str(tiny_exports),
        "--model", MODEL, "--clients", "4", "--workers", "1", "--probe", "1.5",
        "--duration", "3", "--quiet", "1", "--connections", "16", "--attack-rate", "4",
        "--ids", "20000", "--max-requests", "40",
    )  # fmt: skip
    # p99 is speed (measured by the drill, never asserted in a test); RSS over 3-s phases is
    # allocator noise (the soak test asserts flat memory over thousands of requests). So the
    # quiet phases, p99's baselines, run 1 s (the attacks 3 s): what is asserted of them is that
    # their well-behaved requests were served, again and again, and none failed.
    functional = {name: ok for name, ok in result["checks"].items()
                  if "p99" not in name and "RSS" not in name}  # fmt: skip
    failed = [name for name, ok in functional.items() if not ok]
    assert not failed, f"{failed}\n{output[-5000:]}"
    assert len(functional) == 14, functional  # 11 phases, 408s, 2 restarts
    # every phase ran: each of the 4 paced clients was answered and came back for more
    served = {name: figure[0] for name, figure in result["figures"].items()
              if name.endswith("requests / failed / p99 ms")}  # fmt: skip
    assert len(served) == 11 and min(served.values()) > 4, served
    assert set(result["attackers"]) == set(hostile_drill.ATTACKS)
    assert result["attackers"]["idle"].get("200", 0) > 0  # the idle ones made a request first
    assert code in (0, 1)  # 1 only for a latency or memory check, reported above

"""Golden answers of every inference route: today's answer bodies recorded, new code held to them.

A case is one request (route, body) to a tiny model of a started test stack; its golden file
``tests/backend/golden/<case>.json`` holds the answer body exactly as the gateway wrote it
(the one random field, a Cohere/Jina answer's ``"id"`` uuid4, is checked to be a uuid4 and
then written as ``<uuid4>``). ``golden/MACHINE.txt`` names the machine that recorded them.

How an answer is held to its file, and why:

- The answer must be **byte-identical** (key order, whitespace, float formatting, labels, every
  digit) on every machine whose model server computes as the recording one's did: the same CPU
  class and kernel flags and the same usable cores as ``golden/MACHINE.txt`` says (the CPU's
  model name is not asked: a machine of another vendor or generation with the same flags and
  cores runs the same kernels with the same thread split).
- Only where that differs, and for the reason ``mode()`` states, is the answer held **within
  tolerance**: the model server's float32 arithmetic differs in the last bits (AVX2 and
  AVX-512 kernels sum in other orders; TF's intra-op threads, one per usable core, split the
  matmuls differently), so bytes cannot be compared. The run says which mode it used and why in
  its summary (tests/backend/conftest.py). Within tolerance, the answer is cut into its
  **shape** and its **numbers**: the shape
  is the body with every number literal replaced by its kind and must still be byte-identical
  (so key order, whitespace, strings, labels and entity spans are exact); integers are exact
  (a case of int8/uint8 quantized vectors allows 1 step, a component on a rounding edge); a
  float is within 1e-5 + 1e-4 × |golden| of its golden value. A float's kind is *how it was
  written*: ``f32`` the shortest literal that reads back as the same float32 (orjson's numpy
  float32), ``f64`` the shortest for a float64 (orjson's Python float), ``py`` Python's repr
  (``json.dumps``: ``1e-05``, where orjson writes ``0.00001``), else ``other``. So a change of
  serialization (float32 answered as float64 digits, another JSON writer, reordered keys,
  spaces) fails on every machine, not only on the recording one. The tiny models are exported
  in fp32 (export_tiny_model's and build's default), never bf16, on both CPU classes.
- A case with base64 float32 vectors (OpenAI ``encoding_format: base64``) compares the decoded
  float32 values the same way on another machine.

Re-recording (only when an answer is *meant* to change; say why in the commit):
``GATEWAY_GOLDEN_RECORD=1 .venv/bin/python -m pytest -q tests/backend/test_golden.py
tests/backend/test_heads_e2e.py -k golden`` rewrites every case's file and MACHINE.txt from
the gRPC gateway, then the REST gateway's answers are held to them as usual.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import requests

from export.hardware import cpu_info
from tests import summary

GOLDEN_DIR = Path(__file__).parent / "golden"
MACHINE_FILE = GOLDEN_DIR / "MACHINE.txt"
RECORD_VAR = "GATEWAY_GOLDEN_RECORD"
UUID_PLACEHOLDER = b'"id":"<uuid4>"'
_UUID_FIELD = re.compile(rb'"id":"([0-9a-f-]{36})"')
# A JSON string (kept verbatim in the shape) or a number literal (replaced by its kind).
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?')
_B64 = re.compile(rb'"([A-Za-z0-9+/]{16,}={0,2})"')
RTOL, ATOL = 1e-4, 1e-5


@dataclass(frozen=True)
class Case:
    """One request whose answer body is golden."""

    name: str
    path: str
    body: dict[str, Any]
    quantized: bool = False  # int8/uint8 vectors: 1 step allowed off the recording machine
    base64_floats: bool = False  # base64 float32 vectors: decoded and compared off it


def recording() -> bool:
    """True when the run re-records the golden files (GATEWAY_GOLDEN_RECORD=1)."""
    return os.environ.get(RECORD_VAR) == "1"


BYTES, TOLERANCE = "byte-identical", "within tolerance"
# "<model> (<class>: <flags>), <n> cores", export.hardware.CpuInfo.describe()'s line
_MACHINE = re.compile(
    r"^(?P<model>.*) \((?P<kind>[^:()]+): (?P<flags>[^()]*)\), (?P<cores>\d+) cores$"
)
GOLDEN_SECTION = "golden answers"  # the run's summary says how they were held (tests/summary.py)


def machine() -> str:
    """Return the line that names this machine (MACHINE.txt holds the recording one's)."""
    return cpu_info().describe()


def mode(recorded: str, here: str) -> tuple[str, str]:
    """Return (BYTES or TOLERANCE, why) for holding answers recorded on ``recorded`` here:
    within tolerance only where the CPU class, the kernel flags or the usable cores differ."""
    was, now = _MACHINE.match(recorded.strip()), _MACHINE.match(here.strip())
    if was is None or now is None:
        return TOLERANCE, f"a machine line that cannot be read: {recorded.strip()!r}"
    differ = [
        f"{what} {was[key]!r} there, {now[key]!r} here"
        for key, what in (("kind", "CPU class"), ("flags", "kernel flags"), ("cores", "cores"))
        if was[key] != now[key]
    ]
    if differ:
        return TOLERANCE, "the model server's arithmetic differs: " + "; ".join(differ)
    return BYTES, f"this machine computes as the recording one: {now['kind']}, {now['cores']} cores"


def answer(url: str, case: Case) -> bytes:
    """Return the gateway's answer body to ``case`` with its uuid4 ``id`` masked (200 only)."""
    response = requests.post(f"{url}{case.path}", json=case.body, timeout=60)
    assert response.status_code == 200, (case.name, response.status_code, response.text)
    assert response.headers["Content-Type"] == "application/json", response.headers
    return mask_ids(response.content)


def mask_ids(body: bytes) -> bytes:
    """Return ``body`` with each ``"id":"<uuid4>"`` field's value replaced by a placeholder."""
    for match in _UUID_FIELD.finditer(body):
        assert uuid.UUID(match.group(1).decode()).version == 4, match.group(0)
    return _UUID_FIELD.sub(UUID_PLACEHOLDER, body)


def golden_file(case: Case) -> Path:
    return GOLDEN_DIR / f"{case.name}.json"


def check(url: str, case: Case, record: bool) -> None:
    """Hold the answer to ``case`` to its golden file (``record``: write the file first)."""
    got = answer(url, case)
    path = golden_file(case)
    if record:
        GOLDEN_DIR.mkdir(exist_ok=True)
        path.write_bytes(got)
        MACHINE_FILE.write_text(machine() + "\n", encoding="utf-8")
    assert path.is_file(), f"no golden file {path.name}: record it ({RECORD_VAR}=1)"
    want = path.read_bytes()
    held, why = mode(MACHINE_FILE.read_text(encoding="utf-8"), machine())
    summary.add(GOLDEN_SECTION, f"golden answers: {held} ({why})")
    if held == BYTES:
        assert got == want, f"{case.name}: the answer is not byte-identical to {path.name} ({why})"
        return
    assert_same_answer(got, want, case)


def assert_same_answer(got: bytes, want: bytes, case: Case) -> None:
    """Assert ``got`` has ``want``'s shape and, to the tolerance, its numbers (another machine)."""
    got_shape, got_numbers = shape(got, case.base64_floats)
    want_shape, want_numbers = shape(want, case.base64_floats)
    assert got_shape == want_shape, f"{case.name}: the answer's shape differs from the golden"
    assert len(got_numbers) == len(want_numbers)
    for index, (a, b) in enumerate(zip(got_numbers, want_numbers, strict=True)):
        if isinstance(b, int):
            assert abs(int(a) - b) <= (1 if case.quantized else 0), (case.name, index, a, b)
        else:
            assert abs(a - b) <= ATOL + RTOL * abs(b), (case.name, index, a, b)


def shape(body: bytes, base64_floats: bool = False) -> tuple[bytes, list[float | int]]:
    """Return (the body with every number literal replaced by ``<kind>``, the numbers)."""
    pieces: list[bytes] = []
    numbers: list[float | int] = []
    last = 0
    for match in _TOKEN.finditer(body):
        pieces.append(body[last : match.start()])
        last = match.end()
        token = match.group(0)
        if token.startswith(b'"'):
            floats = _base64_floats(token) if base64_floats else None
            if floats is None:
                pieces.append(token)
            else:
                pieces.append(b'"<base64 %d float32>"' % len(floats))
                numbers.extend(floats)
        elif re.fullmatch(rb"-?\d+", token):
            pieces.append(b"<int>")
            numbers.append(int(token))
        else:
            pieces.append(b"<" + float_kind(token).encode() + b">")
            numbers.append(float(token))
    pieces.append(body[last:])
    return b"".join(pieces), numbers


def float_kind(literal: bytes) -> str:
    """Return which writer wrote ``literal``: f32 (shortest float32), f64, py (repr), other."""
    value = float(literal)
    if literal == orjson.dumps(np.float32(value), option=orjson.OPT_SERIALIZE_NUMPY):
        return "f32"
    if literal == orjson.dumps(value):
        return "f64"
    return "py" if literal == repr(value).encode() else "other"


def _base64_floats(token: bytes) -> list[float] | None:
    match = _B64.fullmatch(token)
    if match is None:
        return None
    try:
        raw = base64.b64decode(match.group(1), validate=True)
    except binascii.Error:
        return None
    if len(raw) % 4:
        return None
    return np.frombuffer(raw, dtype="<f4").astype(float).tolist()

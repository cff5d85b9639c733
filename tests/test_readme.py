"""The documents' examples, run against the stack `make run` starts, so the documents can't drift.

Each ```bash block in the README or a page under docs/ that holds a `curl ... localhost:8000...`
line is followed by a ```json block with the answer it showed; this test runs the same command
(on free ports) and requires the answer to match: same keys, same labels and versions, and lists
shortened with "..." in the page compared on their shown prefix (strings ending in "..."
likewise). Each ```python block that talks to `localhost:8000` runs against the same stack, must
finish cleanly and print what its comments show: a line ``print(x)  # shown`` (or a bare
expression ``x  # shown``, printed as a console would show it) must print ``shown``, compared as
the curl answers are (a note after two spaces or "; " in the comment is not part of it).

Numbers are compared relative to their magnitude, because version 2 of each demo model is
exported with ``--precision auto``: BF16 on a CPU with native bf16, FP32 elsewhere, so the same
README must hold for both. A list of numbers (an embedding prefix, logits) is one vector: its
relative L2 error must stay within ``VECTOR_RTOL`` (BF16 vs FP32 embeddings differ by
1 - cos <= 6e-4, a few percent of the norm; another text's vector differs by ~100 %). A lone number
(a score) may differ by ``SCALAR_RTOL`` of itself. Both also allow the README's rounding to
``README_DECIMALS`` decimals.
"""

from __future__ import annotations

import ast
import json
import math
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ops.demo import stack as run_stack
from ops.procs import REPO, free_port

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]
MODELS = REPO / "models"
BLOCK_RE = re.compile(
    r"```bash\n(?P<cmd>curl [^\n]*localhost:8000[^\n]*)\n```\s*\n```json\n(?P<answer>.*?)\n```",
    re.S,
)
PYTHON_RE = re.compile(r"```python\n(?P<code>.*?)\n```", re.S)
VECTOR_RTOL = 0.1
SCALAR_RTOL = 0.05
README_DECIMALS = 4  # answers in the README are rounded to this many decimals
ROUNDING = 0.5 * 10.0**-README_DECIMALS


def readme_examples() -> list[tuple[str, str]]:
    """Return (curl command, shown answer) pairs from the README and the docs, each once."""
    found: dict[str, str] = {}
    for page in PAGES:
        for m in BLOCK_RE.finditer(page.read_text(encoding="utf-8")):
            found.setdefault(m["cmd"], m["answer"])
    return list(found.items())


def python_examples() -> list[tuple[str, str]]:
    """Return (page, code) for every Python block of the README and docs that calls the stack."""
    return [
        (str(page.relative_to(REPO)), m["code"])
        for page in PAGES
        for m in PYTHON_RE.finditer(page.read_text(encoding="utf-8"))
        if "localhost:8000" in m["code"]
    ]


# a top-level line with a comment: the statement, and what the comment shows after "# "
SHOWN_RE = re.compile(r"^(?P<stmt>[^\s#].*?)\s+#\s(?P<shown>.*)$")


def shown_outputs(code: str) -> tuple[str, list[str]]:
    """Return ``code`` with each commented bare expression printed, and the outputs its comments
    show, in order (a comment on an assignment or an import shows nothing)."""
    lines, shown = [], []
    for line in code.splitlines():
        m = SHOWN_RE.match(line)
        if m and _is_expression(m["stmt"]):
            stmt = m["stmt"] if m["stmt"].startswith("print(") else f"print({m['stmt']})"
            lines.append(stmt)
            shown.append(re.split(r"  |; ", m["shown"], maxsplit=1)[0])
        else:
            lines.append(line)
    return "\n".join(lines), shown


def _is_expression(stmt: str) -> bool:
    try:
        ast.parse(stmt, mode="eval")
    except SyntaxError:
        return False
    return True


def _literal(text: str) -> Any:
    """Return ``text`` as a Python literal (tuples as lists, like JSON), or the text itself."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return json.loads(json.dumps(value))


def same_output(shown: str, printed: str, where: str) -> None:
    """Assert that a printed line is what a comment shows: as a literal (numbers within the
    README's tolerance), else word by word."""
    if not isinstance(_literal(shown), str):
        matches(_literal(shown), _literal(printed), where)
        return
    words, got = shown.split(), printed.split()
    assert len(got) == len(words), f"{where}: printed {printed!r}, the page shows {shown!r}"
    for i, (word, actual) in enumerate(zip(words, got, strict=True)):
        matches(_literal(word), _literal(actual), f"{where} word {i}")


def is_number(value: Any) -> bool:
    """Return True for JSON numbers (not booleans)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def close_vectors(shown: list[float], actual: list[Any]) -> bool:
    """Return True when ``actual`` is within ``VECTOR_RTOL`` of ``shown`` in relative L2 norm."""
    if not all(is_number(v) for v in actual):
        return False
    diff = math.sqrt(sum((a - s) ** 2 for a, s in zip(actual, shown, strict=True)))
    norm = math.sqrt(sum(s * s for s in shown))
    return diff <= VECTOR_RTOL * norm + ROUNDING * math.sqrt(len(shown))


def close_scalars(shown: float, actual: Any) -> bool:
    """Return True when ``actual`` is within ``SCALAR_RTOL`` of ``shown`` (plus rounding)."""
    return is_number(actual) and abs(actual - shown) <= SCALAR_RTOL * abs(shown) + ROUNDING


def matches(shown: Any, actual: Any, where: str = "$") -> None:
    """Assert that ``actual`` has what the README ``shown``."""
    if isinstance(shown, dict):
        assert isinstance(actual, dict), f"{where}: expected an object, got {actual!r}"
        for key, value in shown.items():
            assert key in actual, f"{where}: missing key {key!r}"
            matches(value, actual[key], f"{where}.{key}")
    elif isinstance(shown, list):
        assert isinstance(actual, list), f"{where}: expected a list, got {actual!r}"
        prefix = shown[:-1] if shown and shown[-1] == "..." else shown
        if len(prefix) == len(shown):
            assert len(actual) == len(shown), (
                f"{where}: {len(actual)} items, README shows {len(shown)}"
            )
        assert len(actual) >= len(prefix), f"{where}: {len(actual)} items, README shows more"
        if (
            prefix
            and all(is_number(v) for v in prefix)
            and any(isinstance(v, float) for v in prefix)
        ):
            got = actual[: len(prefix)]
            assert close_vectors(prefix, got), f"{where}: {got} vs README {prefix}"
            return
        for i, value in enumerate(prefix):
            matches(value, actual[i], f"{where}[{i}]")
    elif isinstance(shown, float) or (isinstance(shown, int) and isinstance(actual, float)):
        assert close_scalars(shown, actual), f"{where}: {actual} vs README {shown}"
    elif isinstance(shown, str) and shown.endswith("..."):  # a message cut short in the README
        assert isinstance(actual, str) and actual.startswith(shown[:-3]), f"{where}: {actual!r}"
    else:
        assert actual == shown, f"{where}: {actual!r} vs README {shown!r}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[run_stack.Ports]:
    if not (MODELS / "minilm").is_dir() or not (MODELS / "minilm-intent").is_dir():
        pytest.fail("demo models not built: run `make models` (make test does)")
    ports = run_stack.Ports(grpc=free_port(), rest=free_port(), gateway=free_port())
    state = tmp_path_factory.mktemp("stack")
    try:
        run_stack.start_stack(MODELS, ports, state_dir=state)
        yield ports
    finally:
        run_stack.stop_stack(state)


def test_readme_has_curl_examples_for_every_endpoint() -> None:
    commands = " ".join(cmd for cmd, _ in readme_examples())
    for route in (":classify", ":embed", "/v1/models/minilm-intent", "/healthz", "/readyz"):
        assert route in commands, f"no README example for {route}"


@pytest.mark.parametrize("command,answer", readme_examples(), ids=lambda v: v[:60])
def test_readme_example_gives_the_answer_it_shows(
    stack: run_stack.Ports, command: str, answer: str
) -> None:
    argv = [
        arg.replace("localhost:8000", f"127.0.0.1:{stack.gateway}") for arg in shlex.split(command)
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    matches(json.loads(answer), json.loads(out))


@pytest.mark.parametrize(
    "page,code", python_examples(), ids=lambda v: v.splitlines()[0][:40] if "\n" in v else v
)
def test_python_example_runs_against_the_stack(
    stack: run_stack.Ports, page: str, code: str
) -> None:
    program, shown = shown_outputs(code.replace("localhost:8000", f"127.0.0.1:{stack.gateway}"))
    assert shown, f"{page}: a Python example that shows no output (a `# ...` after a print)"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{page}: {done.stderr[-2000:]}"
    printed = done.stdout.splitlines()
    assert len(printed) == len(shown), f"{page}: printed {printed}, the page shows {shown}"
    for i, (want, got) in enumerate(zip(shown, printed, strict=True)):
        same_output(want, got, f"{page} output line {i + 1}")


def test_the_readme_and_docs_show_python_clients() -> None:
    pages = {page for page, _ in python_examples()}
    assert "README.md" in pages, "the README's client snippets are gone"


@pytest.mark.parametrize(
    "shown,actual",
    [
        ([-0.034, 0.0316, 0.0065, 0.026, "..."], [-0.0341, 0.0318, 0.0061, 0.0262, 0.5]),
        ({"score": 0.9987}, {"score": 0.9801}),  # BF16 vs FP32 zero-shot: |Δp| up to ~0.02
        ({"score": 0.0001}, {"score": 0.00014}),
        ([5.3949, 3.2017, 16.3307], [5.41, 3.18, 16.29]),
    ],
)
def test_matcher_accepts_precision_differences(shown: Any, actual: Any) -> None:
    matches(shown, actual)


def test_a_python_example_shows_what_its_comments_say_it_prints() -> None:
    code = (
        'import os  # imported\nx = [1.0, 2]  # an assignment\nprint(x, "a")  # [1.0, 2] a\n'
        "len(x)  # 2; a note\n    print(3)  # in a block: 3\n"
    )
    program, shown = shown_outputs(code)
    assert shown == ["[1.0, 2] a", "2"]
    assert program.splitlines()[3] == "print(len(x))"
    same_output("[(0, 0.7633), (2, 0.7499)]", "[(0, 0.7634), (2, 0.75)]", "$")
    same_output("minilm@2 384", "minilm@2 384", "$")
    for shown_line, printed in (
        ("minilm@2 384", "minilm@1 384"),
        ("minilm@2 384", "minilm@2"),
        ("[(0, 0.7633)]", "[(2, 0.7633)]"),
        ("technical", "billing"),
    ):
        with pytest.raises(AssertionError):
            same_output(shown_line, printed, "$")


@pytest.mark.parametrize(
    "shown,actual",
    [
        # within the old absolute 0.05 on every component, yet another vector
        ([-0.034, 0.0316, 0.0065, 0.026, "..."], [0.01, -0.01, 0.04, -0.02, 0.5]),
        ({"score": 0.9987}, {"score": 0.9}),
        ({"score": 0.0001}, {"score": 0.02}),
        ([5.3949, 3.2017, 16.3307], [6.3949, 3.2017, 14.3307]),
        ([-0.034, 0.0316, "..."], [-0.034]),
    ],
)
def test_matcher_rejects_other_answers(shown: Any, actual: Any) -> None:
    with pytest.raises(AssertionError):
        matches(shown, actual)

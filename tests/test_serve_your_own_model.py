"""docs/guides/serve-your-own-model.md, run start to finish: every command of its ```bash blocks,
in order, in a copy of the repository, on free ports, with a tiny checkpoint saved by transformers.

The copy holds the code, the committed serving config (which the guide's command edits), the demo
models (linked, read-only) and the checkpoint at ``my-checkpoint/``; ``make run`` and ``make stop``
start and stop the stack there as they would (``ops.demo.stack``, on free ports), and every
``localhost:<port>`` of a command becomes that port. A ```json block after a command shows (part
of) its answer: keys, strings and list lengths must match ("..." ends a list or string shown in
part); numbers must be numbers (the checkpoint is random).

Each checkpoint maker writes what ``save_pretrained`` writes for one architecture (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json: no vocab.txt); another architecture is
one more entry in ``CHECKPOINTS``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ops.demo import stack as localstack
from ops.procs import REPO, child_env, free_port

GUIDE = REPO / "docs" / "guides" / "serve-your-own-model.md"
BLOCK_RE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$", re.S | re.M)
SHELL_LANGS = {"sh", "shell", "console", "zsh", "bash"}
CODE = ["backend", "export", "modelformat", "modelserver", "ops", "scripts", "docker"]
DEMO_MODELS = ["minilm", "minilm-intent"]
CORPUS = [
    "the parcel arrived broken and late",
    "thank you, the support team was great",
    "my card was charged twice for one order",
    "where is my refund? nobody answers",
    "fast delivery, lovely service",
]
LABELS = {0: "complaint", 1: "praise"}


def roberta_checkpoint(dest: Path) -> None:
    """A random 2-layer RobertaForSequenceClassification saved by transformers, with a byte-level
    BPE tokenizer.json trained by HF tokenizers (export/tiny_tokenizers.py) and no vocab.txt."""
    import torch
    from transformers import RobertaConfig, RobertaForSequenceClassification

    from export.tiny_tokenizers import build_tokenizer, write_tokenizer

    tok: Any = build_tokenizer("bpe")
    torch.manual_seed(0)
    config = RobertaConfig(
        vocab_size=tok.get_vocab_size(with_added_tokens=True), hidden_size=32,
        num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
        max_position_embeddings=130, type_vocab_size=1, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, id2label=LABELS, label2id={v: k for k, v in LABELS.items()},
    )  # fmt: skip
    RobertaForSequenceClassification(config).save_pretrained(dest)
    write_tokenizer(dest, "bpe", trained=tok)


# one line per architecture the guide is run with
CHECKPOINTS: dict[str, Callable[[Path], None]] = {"roberta": roberta_checkpoint}


def guide_steps() -> list[tuple[str, str | None]]:
    """Return (shell command block, the JSON answer shown after it or None), in order."""
    blocks = [(m["lang"], m["body"].strip()) for m in BLOCK_RE.finditer(GUIDE.read_text())]
    steps: list[tuple[str, str | None]] = []
    for i, (lang, body) in enumerate(blocks):
        if lang == "bash":
            after = blocks[i + 1] if i + 1 < len(blocks) else ("", "")
            steps.append((body, after[1] if after[0] == "json" else None))
    return steps


def matches(shown: Any, actual: Any, where: str = "$") -> None:
    """Assert that ``actual`` has what the guide shows (numbers: any number)."""
    if isinstance(shown, dict):
        assert isinstance(actual, dict), f"{where}: expected an object, got {actual!r}"
        for key, value in shown.items():
            assert key in actual, f"{where}: missing key {key!r} in {actual!r}"
            matches(value, actual[key], f"{where}.{key}")
    elif isinstance(shown, list):
        assert isinstance(actual, list), f"{where}: expected a list, got {actual!r}"
        prefix = shown[:-1] if shown and shown[-1] == "..." else shown
        if len(prefix) == len(shown):
            assert len(actual) == len(shown), f"{where}: {len(actual)} items, guide shows {shown}"
        for i, value in enumerate(prefix):
            matches(value, actual[i], f"{where}[{i}]")
    elif isinstance(shown, int | float) and not isinstance(shown, bool):
        assert isinstance(actual, int | float) and not isinstance(actual, bool), where
        if isinstance(shown, int):
            assert actual == shown, f"{where}: {actual} vs guide {shown}"
    elif isinstance(shown, str) and shown.endswith("..."):
        assert isinstance(actual, str) and actual.startswith(shown[:-3]), f"{where}: {actual!r}"
    else:
        assert actual == shown, f"{where}: {actual!r} vs guide {shown!r}"


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Path]:
    """Return a copy of the repository to run the guide in (the stack in it stopped after)."""
    missing = [name for name in DEMO_MODELS if not (REPO / "models" / name).is_dir()]
    if missing:
        pytest.fail(f"demo models not built ({missing}): run `make models` (make test does)")
    root = tmp_path / "repo"
    for name in CODE:
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "serving_config", root / "serving_config")
    for name in DEMO_MODELS:  # read-only; version 1 only (loading costs); the guide's model
        (root / "models" / name).mkdir(parents=True)  # is written beside them
        (root / "models" / name / "1").symlink_to((REPO / "models" / name / "1").resolve())
    (root / ".venv").symlink_to((REPO / ".venv").resolve())
    try:
        yield root
    finally:
        localstack.stop_stack(root / ".stack")


def run_step(
    root: Path, command: str, ports: localstack.Ports, answer: str | None
) -> subprocess.CompletedProcess[str] | None:
    """Run one of the guide's commands in ``root``; check the answer it shows."""
    if command == "make run":
        localstack.start_stack(root / "models", ports, state_dir=root / ".stack")
        return None
    if command == "make stop":
        localstack.stop_stack(root / ".stack")
        return None
    for name, port in (("8000", ports.gateway), ("8500", ports.grpc), ("8501", ports.rest)):
        command = command.replace(f"localhost:{name}", f"127.0.0.1:{port}")
    env = child_env(
        PYTHONPATH=str(root), PATH=f"{root / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"
    )
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    if answer is not None:
        matches(json.loads(answer), json.loads(result.stdout))
    return result


def test_the_guide_runs_only_bash_blocks_and_starts_and_stops_a_stack() -> None:
    langs = {m["lang"] for m in BLOCK_RE.finditer(GUIDE.read_text())}
    assert langs & SHELL_LANGS == {"bash"}, "a shell block the test would not run"
    commands = [command for command, _ in guide_steps()]
    assert commands[0] != "make run" and "make run" in commands and commands[-1] == "make stop"


@pytest.mark.timeout(600)  # a stack, two exports and a model load on 2 shared cores
@pytest.mark.parametrize("make_checkpoint", CHECKPOINTS.values(), ids=list(CHECKPOINTS))
def test_every_command_of_the_guide_works_start_to_finish(
    sandbox: Path, make_checkpoint: Callable[[Path], None]
) -> None:
    make_checkpoint(sandbox / "my-checkpoint")
    ports = localstack.Ports(grpc=free_port(), rest=free_port(), gateway=free_port())
    runs = []
    for command, answer in guide_steps():
        started = time.monotonic()
        result = run_step(sandbox, command, ports, answer)
        print(f"{time.monotonic() - started:6.1f}s  {command}")
        runs.append((command, result.stdout if result is not None else ""))

    adds = [out for command, out in runs if "push_model.py --add" in command]
    assert len(adds) == 2 and "my-classifier v1 AVAILABLE" in adds[0], adds
    assert "nothing to do" in adds[1]  # the same command again changed nothing
    committed = (sandbox / "serving_config" / "models.config").read_text()
    assert 'base_path: "/models/my-classifier"' in committed
    assert committed.startswith((REPO / "serving_config" / "models.config").read_text()[:200])

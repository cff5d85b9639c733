# syntax=docker/dockerfile:1
# The gateway image: Flask under gunicorn, no TensorFlow (the gateway never imports it).
# Build from the repository root:  docker build -f docker/backend.Dockerfile -t bert-gateway .
ARG PYTHON_IMAGE=python:3.11-slim

# Stage 1: compile the gateway's TF-Serving messages (modelformat/protos); grpcio-tools stays in this stage only.
# The compiler needs only grpcio-tools, its grpcio and protobuf held to the runtime's pins (-c).
FROM ${PYTHON_IMAGE} AS protos
WORKDIR /src
COPY requirements-gateway.txt ./
RUN pip install --no-cache-dir -c requirements-gateway.txt grpcio-tools==1.85.1
COPY modelformat/ modelformat/
RUN python -m modelformat.protos.build

# Stage 2: the runtime, exactly requirements-gateway.txt.
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --home-dir /app --shell /usr/sbin/nologin gateway
WORKDIR /app
COPY requirements-gateway.txt ./
RUN pip install --no-cache-dir -r requirements-gateway.txt
COPY backend/ backend/
COPY modelformat/ modelformat/
COPY --from=protos /src/modelformat/protos/ modelformat/protos/
COPY docker/gunicorn.conf.py docker/gunicorn.conf.py
USER gateway
EXPOSE 8000
# Exec form: gunicorn is PID 1 and gets SIGTERM directly for a graceful stop.
ENTRYPOINT ["gunicorn", "-c", "docker/gunicorn.conf.py", "backend.app:create_app()"]

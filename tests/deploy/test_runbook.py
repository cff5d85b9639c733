"""docs/guides/kubernetes.md, the runbook: its commands are the repository's, its overlay renders,
its tags are the project's version, and deploy/k8s/run-job.sh makes the Jobs it says.

What needs a cluster's API server (`kubectl create job --from=cronjob/...`, `kubectl create`) is
answered by a stand-in kubectl that serves the rendered CronJob's Job; `kubectl set env --local`
is the real one. The steps that run a stack are tests/deploy/test_kube_play.py's.
"""

from __future__ import annotations

import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ops.images import project_version
from tests.deploy.test_k8s import K8S, KUBECTL, REPO, container, find, push_model_flags, render

GUIDE = REPO / "docs" / "guides" / "kubernetes.md"
# What a runbook command may start with: a tool a team has, or a file of this repository.
TOOLS = {"kubectl", "podman", "docker", "curl", "python", "head", "deploy/k8s/run-job.sh"}

Obj = dict[str, Any]


def blocks(language: str = "") -> list[str]:
    """Return the guide's fenced code blocks of ``language`` ("" for the unlabelled ones)."""
    found: list[str] = []
    fence: str | None = None
    for line in GUIDE.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            if fence is None:
                fence = line[3:].strip()
                found.append("")
            else:
                fence = None
        elif fence is not None:
            found[-1] += line
    fences = re.findall(r"^```(\w*)$", GUIDE.read_text(), re.M)[::2]
    return [block for block, lang in zip(found, fences, strict=True) if lang == language]


def commands() -> list[list[str]]:
    """Return every command line of the guide's unlabelled blocks, split as a shell would."""
    lines = [line for block in blocks() for line in block.splitlines() if line.strip()]
    return [shlex.split(line.rstrip("&").strip()) for line in lines]


def test_every_runbook_command_is_a_tool_or_a_file_of_the_repository() -> None:
    found = commands()
    assert len(found) >= 12
    for argv in found:
        assert argv[0] in TOOLS, argv
        if argv[0] == "python" and argv[1] == "-m":
            module = REPO / argv[2].replace(".", "/")
            assert module.with_suffix(".py").is_file() or (module / "__main__.py").is_file(), argv
        elif argv[0] == "python":
            assert (REPO / argv[1]).is_file(), argv
        mine = "deploy/k8s/overlays/mine"  # the overlay step 2 has you write
        paths = [a for a in argv if a.startswith(("deploy/", "docker/", "scripts/"))]
        paths = [p for p in paths if not p.startswith(mine)]
        assert all((REPO / p).exists() for p in paths), argv


def test_the_runbook_has_its_steps_in_order() -> None:
    steps = re.findall(r"^## (\d)\. (.+)$", GUIDE.read_text(), re.M)
    assert [int(n) for n, _ in steps] == list(range(1, 8))
    words = " ".join(title.lower() for _, title in steps)
    for step in ("build and push", "overlay", "key", "apply", "check", "push a new", "roll back"):
        assert step in words, step


def test_every_image_tag_is_the_projects_version() -> None:
    version = project_version()
    tags = re.findall(r"bert-gateway(?:-ops)?:([\w.]+)", GUIDE.read_text())
    assert tags and set(tags) == {version}
    for path in (K8S / "base" / "kustomization.yaml", *K8S.glob("components/*/kustomization.yaml")):
        for image in yaml.safe_load(path.read_text()).get("images", []):
            if image["name"].startswith("bert-gateway"):
                assert image["newTag"] == version, path


def password_step() -> str:
    """Return the runbook's command line that writes Redis's password (step 3)."""
    lines = [line for block in blocks() for line in block.splitlines()]
    (line,) = [line for line in lines if "redis-password" in line]
    return line


def render_mine(tmp_path: Path, kustomization: str) -> str:
    """Render ``kustomization`` as deploy/k8s/overlays/mine of a copy of deploy/k8s, after the
    runbook's password step has run there (from the copy's root, as from the repository's)."""
    if not (tmp_path / "deploy").exists():
        shutil.copytree(K8S, tmp_path / "deploy" / "k8s")
    mine = tmp_path / "deploy" / "k8s" / "overlays" / "mine"
    mine.mkdir(exist_ok=True)
    (mine / "kustomization.yaml").write_text(kustomization)
    subprocess.run(["sh", "-c", password_step()], cwd=tmp_path, check=True, timeout=10)
    assert KUBECTL
    result = subprocess.run([KUBECTL, "kustomize", str(mine)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_runbooks_overlay_renders_with_the_registrys_images(tmp_path: Path) -> None:
    out = render_mine(tmp_path, blocks("yaml")[0])
    images = {
        c["image"]
        for doc in yaml.safe_load_all(out)
        if doc and doc["kind"] in {"Deployment", "Job", "CronJob"}
        for c in containers_of(doc)
    }
    ours = {i for i in images if "bert-gateway" in i}
    version = project_version()
    assert ours == {f"REGISTRY/bert-gateway:{version}", f"REGISTRY/bert-gateway-ops:{version}"}


def test_the_runbooks_password_is_written_where_git_ignores_it() -> None:
    """Step 3 writes Redis's password into a git-ignored file of the overlay step 2 makes, never
    a tracked one (`git commit -a` would commit it: issue 48 item 3)."""
    from tests.test_docs import tracked_files, written_paths

    (path,) = written_paths(password_step())
    assert path == "deploy/k8s/overlays/mine/redis-password"
    assert path not in tracked_files()
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO)
    assert ignored.returncode == 0, f"{path} is not git-ignored"
    shipped = [p for p in tracked_files() if p.startswith("deploy/") and "password" in p]
    assert not shipped, shipped


def redis_secret(out: str) -> tuple[str, str, set[str]]:
    """Return the rendered Redis Secret's name, its password, and the Secret names the gateway's
    and Redis's containers read REDIS_PASSWORD from."""
    import base64

    docs = [d for d in yaml.safe_load_all(out) if d]
    (secret,) = [d for d in docs if d["kind"] == "Secret"
                 and d["metadata"]["name"].startswith("gateway-redis")]  # fmt: skip
    password = base64.b64decode(secret["data"]["password"]).decode()
    refs = {
        env["valueFrom"]["secretKeyRef"]["name"]
        for d in docs if d["kind"] == "Deployment"
        and d["metadata"]["name"] in ("gateway", "gateway-redis")
        for c in containers_of(d) for env in c.get("env", []) if env["name"] == "REDIS_PASSWORD"
    }  # fmt: skip
    return secret["metadata"]["name"], password, refs


def test_the_runbooks_overlay_makes_the_secret_from_the_password_step(tmp_path: Path) -> None:
    """The overlay of step 2 generates Secret gateway-redis from the file step 3 writes: a new
    password each time, read by both pods, and a new Secret name (the pods roll onto it)."""
    first = redis_secret(render_mine(tmp_path, blocks("yaml")[0]))
    second = redis_secret(render_mine(tmp_path, blocks("yaml")[0]))
    for name, password, refs in (first, second):
        assert re.fullmatch(r"[0-9a-f]{48}", password), password  # goes into a URL as it is
        assert refs == {name}
    assert first[1] != second[1] and first[0] != second[0]


def containers_of(obj: Obj) -> list[Obj]:
    """Return the containers (init containers too) of a workload's pod template."""
    spec = obj["spec"]
    spec = spec.get("jobTemplate", {}).get("spec", spec)["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_the_keyless_overlay_empties_the_keys_setting(tmp_path: Path) -> None:
    from backend.settings import load_settings

    out = render_mine(tmp_path, blocks("yaml")[0] + blocks("yaml")[1])
    env = next(
        d["data"] for d in yaml.safe_load_all(out)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("gateway-env")
    )  # fmt: skip
    assert load_settings(environ=env).api_keys_file == ""


STAND_IN = """#!/bin/sh
# kubectl where there is no cluster: the API server's answers for run-job.sh's calls.
echo "$*" >> "{dir}/calls"
case "$*" in
  *"create job"*) cat "{dir}/$(echo "$*" | sed 's|.*cronjob/\\([a-z-]*\\).*|\\1|').yaml" ;;
  "set env"*) exec "{kubectl}" "$@" ;;
  *"create -f -"*) cat > "{dir}/created.yaml" ;;
  *) exit 1 ;;
esac
"""


def stand_in_kubectl(tmp_path: Path, objs: list[Obj]) -> Path:
    """Write a kubectl that answers from the rendered CronJobs; return it."""
    for name in ("push-model", "rollout"):
        cronjob = find(objs, "CronJob", name)
        job = {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "x", "namespace": cronjob["metadata"]["namespace"]},
            "spec": cronjob["spec"]["jobTemplate"]["spec"],
        }  # fmt: skip
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(job))
    path = tmp_path / "kubectl"
    path.write_text(STAND_IN.format(dir=tmp_path, kubectl=KUBECTL))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def runbook_jobs() -> list[tuple[str, str]]:
    """Return (push|rollout, flags) of every `deploy/k8s/run-job.sh` example in the guide."""
    text = GUIDE.read_text()
    return re.findall(r'deploy/k8s/run-job\.sh (push|rollout) "(--[^"]+)"', text)


@pytest.mark.parametrize(("kind", "flags"), runbook_jobs())
def test_run_job_makes_a_valid_job_with_the_runbooks_flags(
    tmp_path: Path, kind: str, flags: str
) -> None:
    import kubernetes_validate

    if kind == "push":
        used = {arg for arg in flags.split() if arg.startswith("--")}
        assert used <= push_model_flags(), f"push_model has no {used - push_model_flags()}"
    kubectl = stand_in_kubectl(tmp_path, render("cpu"))
    result = subprocess.run(
        [str(K8S / "run-job.sh"), kind, flags], capture_output=True, text=True, timeout=60,
        env={"KUBECTL": str(kubectl), "PATH": "/usr/bin:/bin", "KUBECONFIG": str(tmp_path / "no")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(rf"{kind}-\d+", result.stdout.strip())
    made = yaml.safe_load((tmp_path / "created.yaml").read_text())
    for meta in (made["metadata"], made["spec"]["template"]["metadata"]):
        meta.pop("creationTimestamp", None)
    made.pop("status", None)
    kubernetes_validate.validate(made, kubernetes_validate.latest_version(), strict=True)
    name = "push-model" if kind == "push" else "rollout"
    env = {e["name"]: e.get("value") for e in container(made, name)["env"]}
    assert env["PUSH_ARGS" if kind == "push" else "ROLLOUT_ARGS"] == flags
    calls = (tmp_path / "calls").read_text()
    assert f"-n bert-gateway create job {result.stdout.strip()} --from=cronjob/{name}" in calls


@pytest.mark.parametrize("argv", [[], ["push"], ["deploy", "--x"], ["push", ""]])
def test_run_job_refuses_what_it_cannot_run(argv: list[str]) -> None:
    result = subprocess.run([str(K8S / "run-job.sh"), *argv], capture_output=True, text=True)
    assert result.returncode == 2 and "usage" in result.stderr

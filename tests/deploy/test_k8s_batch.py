"""deploy/k8s/batch/batch-job.yaml: an Indexed Job whose pods each run one shard of ops.batch."""

from __future__ import annotations

import shlex

import yaml

from ops.batch.job import parser
from ops.procs import REPO

JOB = REPO / "deploy" / "k8s" / "batch" / "batch-job.yaml"


def test_the_batch_job_runs_one_shard_per_completion_index_with_flags_the_job_takes() -> None:
    job = yaml.safe_load(JOB.read_text(encoding="utf-8"))
    spec = job["spec"]
    container = spec["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == int(env["BATCH_SHARDS"])
    script = container["command"][-1]
    assert '--shard "$JOB_COMPLETION_INDEX/$BATCH_SHARDS"' in script
    for index in range(spec["completions"]):
        args = parser().parse_args(
            ["--shard", f"{index}/{env['BATCH_SHARDS']}", *shlex.split(env["BATCH_ARGS"])]
        )
        assert args.shard == (index, spec["completions"])
        assert "@" in args.model  # pinned: the pods resolve their spec one by one


def test_the_batch_job_validates_against_the_kubernetes_schema() -> None:
    import kubernetes_validate

    from tests.deploy.test_k8s import KUBERNETES_VERSIONS

    job = yaml.safe_load(JOB.read_text(encoding="utf-8"))
    for version in KUBERNETES_VERSIONS:
        wanted = kubernetes_validate.latest_version() if version == "latest" else version
        kubernetes_validate.validate(job, wanted, strict=True)

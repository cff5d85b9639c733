"""Training: it learns, it resumes after a kill where it stopped, precision follows the machine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from export.hardware import CpuInfo
from finetune.precision import training_precision
from tests.finetune.conftest import TRAIN_KWARGS


class Killed(Exception):
    """Stands in for SIGKILL in the middle of an epoch."""


def test_training_learns_a_separable_set(trained, tiny_bert: Path, data: dict[str, Path]) -> None:  # type: ignore[no-untyped-def]
    from backend.bucketing import pad_batch
    from export.checkpoint import read_checkpoint
    from export.model import run
    from finetune.data import read_examples
    from finetune.modeling import build_model, head_weights
    from finetune.pipeline import make_tokenizer, token_ids

    ckpt = read_checkpoint(tiny_bert)
    weights, labels = head_weights(ckpt, ["neg", "pos"], TRAIN_KWARGS["seed"])
    dev = read_examples(data["dev"])
    rows = token_ids(make_tokenizer(ckpt.vocab, True, 64), dev.texts)
    untrained = run(build_model(ckpt, weights, "float32").serve, pad_batch(rows, 64))
    before = np.mean(untrained["logits"].argmax(-1) == [labels.index(y) for y in dev.labels])

    after = trained.metrics["dev"]["accuracy"]

    assert after >= 0.9
    assert after > before
    assert trained.metrics["best_epoch"] >= 1
    assert len(trained.metrics["epochs"]) == TRAIN_KWARGS["epochs"]


def test_a_killed_run_resumes_and_ends_where_an_uninterrupted_one_does(
    trained,
    tiny_bert: Path,
    data: dict[str, Path],
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    from finetune.output import state_dir
    from finetune.run import finetune
    from finetune.training import TrainConfig

    out = tmp_path / "resumed"
    config = TrainConfig(**TRAIN_KWARGS, save_every_steps=3)
    kwargs = {"test_path": data["dev"], "config": config, "precision": "fp32", "max_seq_len": 64}

    def kill_at_step_13(step: int) -> None:
        if step == 13:  # epoch 2 (8 steps or more per epoch), one step after a save
            raise Killed

    with pytest.raises(Killed):
        finetune(tiny_bert, data["train"], data["dev"], out, on_step=kill_at_step_13, **kwargs)
    assert not out.exists() and state_dir(out).is_dir()
    messages: list[str] = []
    resumed = finetune(tiny_bert, data["train"], data["dev"], out, resume=True,
                       say=messages.append, **kwargs)  # fmt: skip

    assert any(m.startswith("resuming from") and "epoch 2" in m for m in messages)
    assert resumed.metrics["steps"] == trained.metrics["steps"]
    assert resumed.metrics["dev"] == trained.metrics["dev"]
    from safetensors.numpy import load_file

    a = load_file(str(out / "model.safetensors"))
    b = load_file(str(trained.out / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=1e-5, err_msg=name)
    assert not state_dir(out).exists()


def _cpu(flags: str) -> CpuInfo:
    return CpuInfo(model="test CPU", flags=frozenset(flags.split()), cores=2)


@pytest.mark.parametrize(
    ("flags", "gpus", "policy", "loss_scaling"),
    [
        ("avx2 fma", [], "float32", False),
        ("avx2 avx512f avx512_bf16", [], "mixed_bfloat16", False),
        ("avx2 amx_bf16 amx_tile", [], "mixed_bfloat16", False),
        ("avx2 fma", ["/physical_device:GPU:0"], "mixed_float16", True),
    ],
)
def test_auto_precision_follows_the_cpu_flags_and_gpus(
    flags: str, gpus: list[str], policy: str, loss_scaling: bool
) -> None:
    chosen = training_precision("auto", _cpu(flags), gpus)

    assert chosen.policy == policy
    assert chosen.loss_scaling is loss_scaling
    assert chosen.compute_dtype == {"float32": "float32", "mixed_bfloat16": "bfloat16",
                                    "mixed_float16": "float16"}[policy]  # fmt: skip


def test_bf16_on_a_cpu_without_native_bf16_warns() -> None:
    chosen = training_precision("bf16", _cpu("avx2 fma"), [])

    assert chosen.policy == "mixed_bfloat16"
    assert any("emulated" in w for w in chosen.choice.warnings)

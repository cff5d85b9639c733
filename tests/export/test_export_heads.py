"""Every head (issue 22): pair, multi-label, one-logit, regression and tag exports give
transformers' logits on the same checkpoint, in serving_default and the bucket signatures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch  # the test-time numerical reference (requirements-dev.txt)
import transformers

from export.build import build
from export.errors import ExportError
from export.predictor import PersistentPredictor
from export.tiny import write_hf_checkpoint
from modelformat.heads import head_from_info

BUCKET = 32  # texts are padded to this bucket, so seq_32 and serving_default see the same tensors
# every export's max_seq_len: BUCKET is its largest bucket (signatures seq_16, seq_32 and
# serving_default), so no export traces, saves and loads a seq_64 signature no test runs
MAX_LEN = BUCKET
TEXTS = [
    "Café déjà vu: naïve résumé, São Paulo",
    "我的订单还没到 order 12345",
    "my package arrived 🎉👍 thanks!",
    "hello",
]
PAIRS = [
    ("where is my order?", "Café: orders ship in 2 days"),
    ("我的订单", "你好 😀 refund"),
    ("reset password", "log in and change the password"),
    ("é", "the package was delivered yesterday to the wrong address"),
]

HEADS: dict[str, dict[str, Any]] = {
    "tag": {"task": "tag"},
    "multi_label": {
        "labels": ("billing", "shipping", "account", "bug"),
        "problem_type": "multi_label_classification",
        "thresholds": {"billing": 0.3, "shipping": 0.7},
    },
    "regression_pair": {"labels": ("score",), "problem_type": "regression", "text_pair": True},
    "one_logit_pair": {"labels": ("relevant",), "text_pair": True},
    "single_pair": {"labels": ("contradiction", "entailment", "neutral"), "text_pair": True},
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """Each head's tiny checkpoint and its FP32 export (max_seq_len MAX_LEN, no warmup)."""
    root = tmp_path_factory.mktemp("heads")
    out = {}
    for i, (name, kw) in enumerate(HEADS.items()):
        ckpt = write_hf_checkpoint(root / f"ckpt-{name}", seed=10 + i, **kw)
        task = kw.get("task", "classify")
        out[name] = (ckpt, build(ckpt, name, root / "models", task=task, max_seq_len=MAX_LEN,
                                 warmup=False))  # fmt: skip
    return out


def _feeds(ckpt: Path, pair: bool) -> dict[str, np.ndarray]:
    """Tokenize with the checkpoint's own tokenizer (pairs as pairs), padded to the bucket."""
    tokenizer = transformers.BertTokenizer.from_pretrained(str(ckpt), local_files_only=True)
    a, b = (list(x) for x in zip(*PAIRS, strict=True)) if pair else (TEXTS, None)
    enc = tokenizer(a, b, padding="max_length", max_length=BUCKET, truncation=True,
                    return_tensors="np")  # fmt: skip
    return {k: np.asarray(enc[k], np.int32) for k in ("input_ids", "attention_mask",
                                                      "token_type_ids")}  # fmt: skip


def _torch_logits(ckpt: Path, task: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    cls = (transformers.BertForTokenClassification if task == "tag"
           else transformers.BertForSequenceClassification)  # fmt: skip
    model = cls.from_pretrained(str(ckpt), local_files_only=True).eval()
    with torch.no_grad():
        out = model(**{k: torch.tensor(v, dtype=torch.long) for k, v in feeds.items()})
    return np.asarray(out.logits.numpy())


def _activate(logits: np.ndarray, activation: str) -> np.ndarray:
    """transformers' text-classification pipeline's function_to_apply."""
    if activation == "softmax":
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return np.asarray(e / e.sum(-1, keepdims=True))
    if activation == "sigmoid":
        return np.asarray(1.0 / (1.0 + np.exp(-logits)))
    return logits


@pytest.mark.parametrize("name", list(HEADS))
def test_head_matches_transformers_in_default_and_bucket_signature(
    exported: dict[str, tuple[Path, Any]], name: str
) -> None:
    ckpt, result = exported[name]
    info = result.model_info
    feeds = _feeds(ckpt, bool(info.get("text_pair")))
    if info.get("text_pair"):  # the second segment really is segment B
        assert feeds["token_type_ids"].max() == 1
    expected = _torch_logits(ckpt, info["task"], feeds)
    predictor = PersistentPredictor(result.path)
    default = predictor.predict(feeds)
    bucket = predictor.predict(feeds, info["bucket_signatures"][str(BUCKET)])
    activation = "softmax" if info["task"] == "tag" else info["score_activation"]
    for got in (default, bucket):
        assert got["logits"].shape == expected.shape
        np.testing.assert_allclose(got["logits"], expected, atol=1e-4)
        np.testing.assert_allclose(got["probabilities"], _activate(expected, activation),
                                   atol=1e-5)  # fmt: skip


def test_tag_outputs_are_per_token_with_labels_last(exported: dict[str, tuple[Path, Any]]) -> None:
    ckpt, result = exported["tag"]
    feeds = _feeds(ckpt, pair=False)
    out = PersistentPredictor(result.path).predict(feeds)
    assert out["logits"].shape == (len(TEXTS), BUCKET, 5)
    np.testing.assert_allclose(out["probabilities"].sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("tag", {"task": "tag", "label_scheme": "BIO",
                 "labels": ["O", "B-ORDER", "I-ORDER", "B-EMAIL", "I-EMAIL"], "pooling": "none"}),
        ("multi_label", {"task": "classify", "problem_type": "multi_label_classification",
                         "score_activation": "sigmoid", "text_pair": False,
                         "thresholds": {"billing": 0.3, "shipping": 0.7, "account": 0.5,
                                        "bug": 0.5}}),
        ("regression_pair", {"problem_type": "regression", "score_activation": "none",
                             "text_pair": True, "labels": ["score"]}),
        ("one_logit_pair", {"problem_type": "single_label_classification",
                            "score_activation": "sigmoid", "text_pair": True}),
        ("single_pair", {"problem_type": "single_label_classification",
                         "score_activation": "softmax", "text_pair": True}),
    ],
)  # fmt: skip
def test_model_json_records_the_head(
    exported: dict[str, tuple[Path, Any]], name: str, keys: dict[str, Any]
) -> None:
    _, result = exported[name]
    info = json.loads((result.path / "assets" / "model.json").read_text(encoding="utf-8"))
    assert {k: info.get(k) for k in keys} == keys
    assert info["outputs"] == ["logits", "probabilities"]
    assert head_from_info(info).to_info().items() <= info.items()
    labels = (result.path / "assets" / "labels.txt").read_text(encoding="utf-8").split()
    assert labels == info["labels"]


def test_old_defaults_are_unchanged(classify_v1, embed_v1) -> None:  # type: ignore[no-untyped-def]
    assert {k: classify_v1.model_info[k] for k in ("task", "problem_type", "score_activation",
                                                   "text_pair", "labels")} == {
        "task": "classify", "problem_type": "single_label_classification",
        "score_activation": "softmax", "text_pair": False,
        "labels": ["negative", "neutral", "positive"],
    }  # fmt: skip
    assert "thresholds" not in classify_v1.model_info
    assert embed_v1.model_info["task"] == "embed" and "problem_type" not in embed_v1.model_info


def test_problem_type_and_text_pair_flags_override_config(
    hf_classify: Path, tmp_path: Path
) -> None:
    result = build(hf_classify, "m", tmp_path, max_seq_len=32, warmup=False, text_pair=True,
                   problem_type="multi_label_classification")  # fmt: skip
    info = result.model_info
    assert info["text_pair"] is True and info["score_activation"] == "sigmoid"
    assert info["thresholds"] == {"negative": 0.5, "neutral": 0.5, "positive": 0.5}


def _edited(src: Path, dest: Path, **config: Any) -> Path:
    """Return a copy of checkpoint ``src`` with config.json keys replaced (None deletes)."""
    import shutil

    shutil.copytree(src, dest)
    data = json.loads((dest / "config.json").read_text(encoding="utf-8"))
    for key, value in config.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    (dest / "config.json").write_text(json.dumps(data), encoding="utf-8")
    return dest


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("tag_as_classify", "BertForTokenClassification .*--task tag"),
        ("classify_as_tag", "BertForSequenceClassification .*--task classify"),
        ("tag_without_classifier", "no token classifier"),
        ("tag_not_bio", "must be BIO"),
        ("early_exit_tag", "single-label classifier"),
        ("early_exit_multi_label", "--early-exit serves single-label classifiers only"),
        ("unknown_threshold_label", "thresholds for unknown labels"),
        ("threshold_out_of_range", r"thresholds are probabilities in \[0, 1\]"),
        ("unknown_problem_type", "problem_type must be one of"),
        ("label_prompts_with_tag", "--label-prompts builds a classification head"),
    ],
)
def test_head_refusals_publish_nothing(
    exported: dict[str, tuple[Path, Any]], hf_classify: Path, hf_embed: Path, tmp_path: Path,
    case: str, match: str,
) -> None:  # fmt: skip
    tag_ckpt = exported["tag"][0]
    multi = exported["multi_label"][0]
    kw: dict[str, Any] = {"max_seq_len": 32, "warmup": False}
    prompts = tmp_path / "prompts.tsv"
    prompts.write_text("a\tsomething\nb\tother\n", encoding="utf-8")
    edit = {
        "tag_not_bio": (tag_ckpt, {"id2label": {str(i): f"L{i}" for i in range(5)}}),
        "unknown_threshold_label": (multi, {"thresholds": {"nope": 0.5}}),
        "threshold_out_of_range": (multi, {"thresholds": {"bug": 1.5}}),
        "unknown_problem_type": (hf_classify, {"problem_type": "ranking"}),
    }
    ckpt = {
        "tag_as_classify": tag_ckpt,
        "classify_as_tag": hf_classify,
        "tag_without_classifier": hf_embed,
        "early_exit_tag": tag_ckpt,
        "early_exit_multi_label": multi,
        "label_prompts_with_tag": tag_ckpt,
    }.get(case) or _edited(edit[case][0], tmp_path / "edited", **edit[case][1])
    task = "tag" if "tag" in case and case != "tag_as_classify" else "classify"
    if case.startswith("early_exit"):
        kw["early_exit"] = True
    if case == "label_prompts_with_tag":
        kw["label_prompts"] = prompts
    base = tmp_path / "models"
    with pytest.raises(ExportError, match=match):
        build(ckpt, "m", base, task=task, **kw)
    assert not (base / "m").exists() or not any((base / "m").iterdir())


def test_cli_takes_task_tag_problem_type_and_text_pair(
    exported: dict[str, tuple[Path, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from export.cli import main

    common = ["--base-path", str(tmp_path), "--max-seq-len", "32", "--no-warmup"]
    tag_ckpt, one_logit = exported["tag"][0], exported["one_logit_pair"][0]
    assert main(["build", "--checkpoint", str(tag_ckpt), "--name", "t", "--task", "tag",
                 *common]) == 0  # fmt: skip
    assert main(["build", "--checkpoint", str(one_logit), "--name", "r", "--problem-type",
                 "regression", "--no-text-pair", *common]) == 0  # fmt: skip
    assert main(["build", "--checkpoint", str(tag_ckpt), "--name", "x", *common]) == 1
    assert "export it with --task tag" in capsys.readouterr().err
    tag = json.loads((tmp_path / "t" / "1" / "assets" / "model.json").read_text())
    scorer = json.loads((tmp_path / "r" / "1" / "assets" / "model.json").read_text())
    assert (tag["task"], tag["label_scheme"]) == ("tag", "BIO")
    assert (scorer["problem_type"], scorer["score_activation"], scorer["text_pair"]) == (
        "regression", "none", False)  # fmt: skip


# each head's rule in verify's figures (export/gates.py's gate_metric)
RULES = {"tag": "decisive_entity_agreement", "multi_label": "decisive_decision_agreement",
         "regression_pair": "max_score_diff"}  # fmt: skip


def _flipped(ckpt: Path, where: Path, scale: float = -1.0) -> Path:
    """Return a copy of ``ckpt`` whose classifier's weights and bias are multiplied by ``scale``:
    -1 (the default) answers the opposite, a version that really differs, where every decision
    and entity moves; a scale near 1 answers a little differently, within verify's tolerance."""
    import shutil

    from safetensors.numpy import load_file, save_file

    shutil.copytree(ckpt, where)
    tensors = load_file(str(ckpt / "model.safetensors"))
    for name in ("classifier.weight", "classifier.bias"):
        tensors[name] = (tensors[name] * scale).astype(tensors[name].dtype)
    save_file(tensors, str(where / "model.safetensors"))
    return where


# the figure of each head that shows two versions' answers differ (a byte copy's are all 0)
DIFFS = {"tag": "max_token_prob_diff", "multi_label": "max_abs_prob_diff",
         "regression_pair": "max_score_diff"}  # fmt: skip


@pytest.mark.parametrize("name", list(RULES))
def test_verify_passes_a_version_that_answers_the_same_by_its_heads_rule(
    exported: dict[str, tuple[Path, Any]], name: str, tmp_path: Path
) -> None:
    """Not a byte copy (whose answers could not differ, so any verify would pass it): the same
    checkpoint with its classifier scaled by 1.001, exported again, answers a little apart."""
    from export.gates import Tolerance, gate_metric
    from export.inspection import verify_version

    ckpt, result = exported[name]
    task = HEADS[name].get("task", "classify")
    near = build(_flipped(ckpt, tmp_path / "near", scale=1.001), name, tmp_path / "models",
                 task=task, max_seq_len=MAX_LEN, warmup=False)  # fmt: skip
    figures = verify_version(near.path, against=result.path)
    assert gate_metric(figures) == RULES[name], figures
    assert figures["all_finite"] is True and figures["within_tolerance"] is True, figures
    bound = {"tag": Tolerance().max_token_prob_diff, "multi_label": Tolerance().max_prob_diff,
             "regression_pair": Tolerance().max_score_diff}[name]  # fmt: skip
    assert 0 < figures[DIFFS[name]] < bound, figures  # apart, and within the tolerance


@pytest.mark.parametrize("name", list(RULES))
def test_verify_flags_a_version_that_really_differs_by_its_heads_rule(
    exported: dict[str, tuple[Path, Any]], name: str, tmp_path: Path
) -> None:
    from export.gates import Tolerance, gate_metric
    from export.inspection import verify_version

    ckpt, result = exported[name]
    task = HEADS[name].get("task", "classify")
    other = build(_flipped(ckpt, tmp_path / "flipped"), name, tmp_path / "models", task=task,
                  max_seq_len=MAX_LEN, warmup=False)  # fmt: skip
    figures = verify_version(other.path, against=result.path)
    assert gate_metric(figures) == RULES[name], figures
    assert figures["all_finite"] is True and figures["within_tolerance"] is False, figures
    bound = Tolerance()
    assert {
        "tag": figures.get("max_token_prob_diff", 0) > bound.max_token_prob_diff,
        "multi_label": figures[RULES[name]] < 1.0,
        "regression_pair": figures[RULES[name]] > bound.max_score_diff,
    }[name], figures

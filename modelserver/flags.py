"""The command line of ``tensorflow_model_server`` that matters here.

Contract 4 of docs/architecture.md.

Accepts ``--flag=value`` and ``--flag value``; boolean flags may stand alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from export.hardware import usable_cores


@dataclass(frozen=True)
class Flags:
    """Parsed server options, named like the binary's flags."""

    port: int
    rest_api_port: int
    rest_api_num_threads: int
    rest_api_timeout_in_ms: int
    grpc_max_threads: int
    model_name: str
    model_base_path: str
    model_config_file: str
    model_config_file_poll_wait_seconds: int
    file_system_poll_wait_seconds: int
    enable_batching: bool
    batching_parameters_file: str
    monitoring_config_file: str
    enable_model_warmup: bool
    num_request_iterations_for_warmup: int
    allow_version_labels_for_unavailable_models: bool
    enable_serialization_as_tensor_content: bool
    rest_api_enable_cors_support: bool
    tensorflow_intra_op_parallelism: int
    tensorflow_inter_op_parallelism: int
    # ours, not the binary's: how a version loads while others serve (modelserver/loading.py)
    load_nice: int = 10
    warmup_duty_cycle: float = 0.5
    ignored: tuple[str, ...] = ()


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_flags(argv: Sequence[str] | None = None) -> Flags:
    """Return the Flags for ``argv`` (defaults as in TF Serving's server.h)."""
    threads = 4 * usable_cores()  # the binary's 4 x cores, counting the cores we may use
    parser = argparse.ArgumentParser(
        prog="python -m modelserver",
        description="TF-Serving-compatible model server (gRPC + REST).",
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("--port", type=int, default=8500, help="gRPC port")
    add("--rest_api_port", type=int, default=0, help="REST port; 0 turns REST off")
    add("--rest_api_num_threads", type=int, default=threads)
    add("--rest_api_timeout_in_ms", type=int, default=30000)
    add("--grpc_max_threads", type=int, default=threads)
    add("--model_name", default="default")
    add("--model_base_path", default="")
    add("--model_config_file", default="")
    add("--model_config_file_poll_wait_seconds", type=int, default=0)
    add("--file_system_poll_wait_seconds", type=int, default=1)
    add("--batching_parameters_file", default="")
    add("--monitoring_config_file", default="")
    add("--num_request_iterations_for_warmup", type=int, default=1)
    for name, default in [
        ("enable_batching", False),
        ("enable_model_warmup", True),
        ("allow_version_labels_for_unavailable_models", False),
        ("enable_serialization_as_tensor_content", False),
        ("rest_api_enable_cors_support", False),
    ]:
        add(f"--{name}", type=_bool, nargs="?", const=True, default=default)
    add("--tensorflow_intra_op_parallelism", type=int, default=0, help="0: TF picks")
    add("--tensorflow_inter_op_parallelism", type=int, default=0, help="0: TF picks")
    # Ours (the binary loads in C++ on --num_load_threads, off the serving path's GIL): a load
    # runs on its own thread at this nice increment, and replays warmup records for at most
    # this share of the wall time, so serving keeps the CPU it needs meanwhile.
    add("--load_nice", type=int, default=10, help="nice increment of the loading thread (0: off)")
    add("--warmup_duty_cycle", type=float, default=0.5,
        help="share of wall time warmup may take once serving (1: the binary's)")  # fmt: skip
    # Accepted so scripts written for the binary run unchanged; they change nothing here.
    for name in IGNORED_FLAGS:
        add(f"--{name}", default=None, help=argparse.SUPPRESS)
    args = vars(parser.parse_args(argv))
    ignored = tuple(name for name in IGNORED_FLAGS if args.pop(name) is not None)
    if not 0 < args["warmup_duty_cycle"] <= 1:
        parser.error("--warmup_duty_cycle must be in (0, 1]")
    return Flags(**args, ignored=ignored)


IGNORED_FLAGS = (
    "max_num_load_retries",
    "load_retry_interval_micros",
    "grpc_channel_arguments",
    "enable_signature_method_name_check",
    "enable_profiler",
    "saved_model_tags",
)

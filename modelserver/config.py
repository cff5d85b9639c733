"""TF Serving's text-proto config files: ModelServerConfig, BatchingParameters, MonitoringConfig.

``model_server_config_pb2`` ships with tensorflow-serving-api. BatchingParameters and
MonitoringConfig don't, so their messages are built here from descriptors with the same package,
names and field numbers as TF Serving's ``session_bundle_config.proto`` and
``monitoring_config.proto`` (wire- and text-format-compatible).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    wrappers_pb2,  # noqa: F401 - registers wrappers.proto in the pool
)
from tensorflow_serving.config import model_server_config_pb2

from export.hardware import usable_cores
from modelformat import serverconfig
from modelformat.errors import FormatError
from modelserver.errors import failed_precondition, invalid

ModelServerConfig = model_server_config_pb2.ModelServerConfig
ModelConfig = model_server_config_pb2.ModelConfig

_F = descriptor_pb2.FieldDescriptorProto


def _build_messages() -> tuple[Any, Any]:
    pool = descriptor_pool.Default()
    try:
        batching = pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
        monitoring = pool.FindMessageTypeByName("tensorflow.serving.MonitoringConfig")
        return (
            message_factory.GetMessageClass(batching),
            message_factory.GetMessageClass(monitoring),
        )
    except KeyError:
        pass
    batch_file = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving/servables/tensorflow/session_bundle_config.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )
    msg = batch_file.message_type.add(name="BatchingParameters")
    for number, name, wrapper in [
        (1, "max_batch_size", "Int64Value"),
        (2, "batch_timeout_micros", "Int64Value"),
        (3, "max_enqueued_batches", "Int64Value"),
        (4, "num_batch_threads", "Int64Value"),
        (5, "thread_pool_name", "StringValue"),
    ]:
        msg.field.add(
            name=name,
            number=number,
            type=_F.TYPE_MESSAGE,
            label=_F.LABEL_OPTIONAL,
            type_name=f".google.protobuf.{wrapper}",
        )
    msg.field.add(name="allowed_batch_sizes", number=6, type=_F.TYPE_INT64, label=_F.LABEL_REPEATED)
    msg.field.add(
        name="pad_variable_length_inputs", number=7, type=_F.TYPE_BOOL, label=_F.LABEL_OPTIONAL
    )
    mon_file = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving/config/monitoring_config.proto",
        package="tensorflow.serving",
        syntax="proto3",
    )
    prom = mon_file.message_type.add(name="PrometheusConfig")
    prom.field.add(name="enable", number=1, type=_F.TYPE_BOOL, label=_F.LABEL_OPTIONAL)
    prom.field.add(name="path", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    mon = mon_file.message_type.add(name="MonitoringConfig")
    mon.field.add(
        name="prometheus_config",
        number=1,
        type=_F.TYPE_MESSAGE,
        label=_F.LABEL_OPTIONAL,
        type_name=".tensorflow.serving.PrometheusConfig",
    )
    pool.Add(batch_file)
    pool.Add(mon_file)
    return (
        message_factory.GetMessageClass(
            pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
        ),
        message_factory.GetMessageClass(
            pool.FindMessageTypeByName("tensorflow.serving.MonitoringConfig")
        ),
    )


BatchingParameters, MonitoringConfig = _build_messages()
PROMETHEUS_DEFAULT_PATH = "/monitoring/prometheus/metrics"


def parse_text(text: str, message: Any, what: str) -> Any:
    """Parse text-format ``text`` into ``message``; raise INVALID_ARGUMENT naming the proto."""
    try:
        return serverconfig.parse(text, message)
    except FormatError as exc:  # TF Serving's words (ParseProtoTextFile)
        raise invalid(f"Error parsing text-format {what}: {exc}") from None


def read_model_server_config(path: str | Path) -> Any:
    """Return the ModelServerConfig in a text-proto file."""
    text = Path(path).read_text(encoding="utf-8")
    return parse_text(text, ModelServerConfig(), "tensorflow.serving.ModelServerConfig")


def read_batching_parameters(path: str | Path) -> Any:
    """Return the BatchingParameters in a text-proto file."""
    text = Path(path).read_text(encoding="utf-8")
    return parse_text(text, BatchingParameters(), "tensorflow.serving.BatchingParameters")


def read_monitoring_config(path: str | Path) -> Any:
    """Return the MonitoringConfig in a text-proto file."""
    text = Path(path).read_text(encoding="utf-8")
    return parse_text(text, MonitoringConfig(), "tensorflow.serving.MonitoringConfig")


def single_model_config(name: str, base_path: str) -> Any:
    """Return the config ``--model_name/--model_base_path`` stand for (BuildSingleModelConfig)."""
    config = ModelServerConfig()
    model = config.model_config_list.config.add()
    model.name = name
    model.base_path = base_path
    model.model_platform = "tensorflow"
    return config


def validate_config(config: Any) -> list[Any]:
    """Return the model configs of a ModelServerConfig, checked as ServerCore does."""
    if config.WhichOneof("config") != "model_config_list":
        raise invalid(
            "ServerModelConfig type not supported by HandleReloadConfigRequest. "
            "Only ModelConfigList is currently supported"
        )
    seen: set[str] = set()
    models = list(config.model_config_list.config)
    for model in models:
        if model.name in seen:
            raise invalid(f"Illegal to list model {model.name} multiple times in config list")
        seen.add(model.name)
        if not (model.base_path.startswith("/") or "://" in model.base_path):
            raise invalid(
                f"Expected model {model.name} to have an absolute path or URI; "
                f"got base_path()={model.base_path}"
            )
        if not model.model_platform and not model.model_type:
            raise failed_precondition(
                "Illegal setting neither ModelServerConfig::model_type (deprecated) nor "
                f"ModelServerConfig::model_platform, model name is {model.name}"
            )
        if model.model_platform and model.model_platform != "tensorflow":
            raise invalid(f"Model {model.name} has an unsupported platform: {model.model_platform}")
    return models


def batching_settings(params: Any) -> dict[str, Any]:
    """Return BatchingParameters as plain values with TF's SharedBatchScheduler defaults."""

    def value(field: str, default: Any) -> Any:
        return getattr(params, field).value if params.HasField(field) else default

    settings: dict[str, Any] = {
        "max_batch_size": int(value("max_batch_size", 1000)),
        "batch_timeout_micros": int(value("batch_timeout_micros", 0)),
        "max_enqueued_batches": int(value("max_enqueued_batches", 10)),
        "num_batch_threads": int(value("num_batch_threads", usable_cores())),
        "allowed_batch_sizes": [int(s) for s in params.allowed_batch_sizes],
        "pad_variable_length_inputs": bool(params.pad_variable_length_inputs),
    }
    sizes = settings["allowed_batch_sizes"]
    if sizes and sizes[-1] != settings["max_batch_size"]:
        raise invalid(
            "Last entry in allowed_batch_sizes must match max_batch_size; last entry was "
            f"{sizes[-1]}; expected {settings['max_batch_size']}"
        )
    if sizes and sizes != sorted(sizes):
        raise invalid("allowed_batch_sizes entries must be monotonically increasing")
    return settings

"""A real in-process gRPC server answering TF Serving's Predict with a scripted handler."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc

from backend.clients.grpc_client import PREDICT
from modelformat.protos import serving_pb2


@contextmanager
def predict_server(handler: Callable[..., Any], max_workers: int = 4) -> Iterator[str]:
    """Serve ``handler`` as PredictionService/Predict on a free port; yield its ``host:port``."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
    service, method = PREDICT.strip("/").split("/")
    rpc = grpc.unary_unary_rpc_method_handler(
        handler,
        request_deserializer=serving_pb2.PredictRequest.FromString,
        response_serializer=serving_pb2.PredictResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: rpc}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)

"""The relay floor of benchmarks/gateway_cost_bench.py: the least a relay like the gateway costs.

gunicorn (gthread) + Flask + one route that ``json.loads`` the body, makes one prepared
``Predict`` call with grpcio's sync unary stub and answers the reply's floats with
``json.dumps``: no validation, tokenization, metrics, logs or headers. It imports nothing of
this project: the message classes are protoc's output of the TF Serving messages (the bench
compiles them into FLOOR_PROTOS, the repo's .proto copies with the ``import`` made top-level:
the same wire format and generated code a user's tensorflow-serving-api has, without the
TensorFlow import that package drags into a process), and the request is prepared: the bench
writes FLOOR_REQUESTS/<n>.pb, the serialized PredictRequest the gateway sends for n texts,
and the floor answers a body of n texts with that call.

Environment: FLOOR_TARGET (the model server's host:port), FLOOR_PROTOS, FLOOR_REQUESTS,
FLOOR_OUTPUT (the output tensor to answer, e.g. ``embedding``).
"""

from __future__ import annotations

import array
import json
import os
import sys
from pathlib import Path

import grpc
from flask import Flask, Response, request

sys.path.insert(0, os.environ["FLOOR_PROTOS"])
import serving_pb2  # compiled by the bench into FLOOR_PROTOS

PREDICT = "/tensorflow.serving.PredictionService/Predict"
OUTPUT = os.environ.get("FLOOR_OUTPUT", "embedding")
PREPARED = {
    int(path.stem): serving_pb2.PredictRequest.FromString(path.read_bytes())
    for path in Path(os.environ["FLOOR_REQUESTS"]).glob("*.pb")
}
# gunicorn imports the app in the worker, after its fork: the channel is the worker's own.
_channel = grpc.insecure_channel(os.environ["FLOOR_TARGET"])
predict = _channel.unary_unary(
    PREDICT,
    request_serializer=serving_pb2.PredictRequest.SerializeToString,
    response_deserializer=serving_pb2.PredictResponse.FromString,
)

app = Flask("relay-floor")


@app.post("/v1/models/<model>:embed")
def embed(model: str) -> Response:
    """Answer the prepared call's floats for as many texts as the body has."""
    texts = json.loads(request.get_data())["texts"]
    reply = predict(PREPARED[len(texts)], timeout=30)
    tensor = reply.outputs[OUTPUT]
    floats = array.array("f", tensor.tensor_content).tolist() or list(tensor.float_val)
    dim = tensor.tensor_shape.dim[-1].size
    rows = [floats[i : i + dim] for i in range(0, len(floats), dim)]
    return Response(json.dumps({"embeddings": rows}), mimetype="application/json")

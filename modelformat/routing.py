"""How a model's default traffic is split between versions: the routing file beside models.config.

``serving_config/routing.yaml`` (the gateway reads it like the labels: bounded staleness, last good
value kept; ``ops.rollout`` writes it atomically)::

    minilm-intent:
      weights: {1: 95, 3: 5}    # version: weight; requests naming no version or label are split
      shadow: {version: 3, share: 1.0}   # also send this share of them to v3, compare, never serve

A model the file doesn't name is routed as before (the newest AVAILABLE version). Requests naming a
version or a label are never split. A request carrying a routing key lands on the same version for
as long as the weights are unchanged, in every worker and after restarts: the key is hashed
(blake2b, not Python's per-process ``hash``) to a point in [0, 1) that falls into one version's
share of the weights laid out in ascending version order. No TensorFlow here.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from modelformat.errors import FormatError

_MODEL_KEYS = ("weights", "shadow")
_SHADOW_KEYS = ("version", "share")


@dataclass(frozen=True)
class Shadow:
    """A version that also gets ``share`` of a model's default requests, answers compared only."""

    version: int
    share: float = 1.0


@dataclass(frozen=True)
class ModelRoute:
    """One model's split: ``weights`` by version (ascending), and an optional shadow."""

    weights: tuple[tuple[int, float], ...] = ()
    shadow: Shadow | None = None

    @property
    def total(self) -> float:
        """Return the sum of the weights (0 when the model's traffic is not split)."""
        return sum(w for _, w in self.weights)

    def share(self, version: int) -> float:
        """Return ``version``'s share of the default traffic, in [0, 1]."""
        total = self.total
        return dict(self.weights).get(version, 0.0) / total if total else 0.0

    def choose(self, key: str | None, model: str, rng: random.Random | None = None) -> int | None:
        """Return the version a default request goes to (None: not split, resolve as usual).

        With ``key`` the choice is a pure function of (model, key, weights): sticky.
        """
        total = self.total
        if total <= 0:
            return None
        point = key_point(model, key) if key is not None else (rng or random).random()
        edge = 0.0
        for version, weight in self.weights:
            edge += weight / total
            if point < edge and weight > 0:
                return version
        return next(v for v, w in reversed(self.weights) if w > 0)  # float rounding at the top

    def shadow_version(self, served: int, rng: random.Random | None = None) -> int | None:
        """Return the version to shadow a request served by ``served`` with, or None."""
        if self.shadow is None or self.shadow.version == served or self.shadow.share <= 0:
            return None
        return self.shadow.version if (rng or random).random() < self.shadow.share else None


@dataclass(frozen=True)
class Routing:
    """Every model's route; ``models`` holds only the models the file names."""

    models: Mapping[str, ModelRoute] = field(default_factory=dict)

    def route(self, model: str) -> ModelRoute | None:
        """Return ``model``'s route, or None when its traffic is not split or shadowed."""
        return self.models.get(model)


EMPTY = Routing()


def key_point(model: str, key: str) -> float:
    """Return the point in [0, 1) a routing key maps to for ``model`` (same in every process)."""
    digest = hashlib.blake2b(f"{model}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def parse(text: str | bytes, source: str = "routing.yaml") -> Routing:
    """Return the routing ``text`` describes; raise FormatError naming the line of a bad value."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise FormatError(f"{source}{where}: not YAML ({getattr(exc, 'problem', exc)})") from exc
    if root is None:
        return EMPTY
    models: dict[str, ModelRoute] = {}
    for key_node, value_node in _mapping(root, source, "the file"):
        name = _scalar(key_node, source, "a model name")
        if name in models:
            raise _error(source, key_node, f"model {name!r} is named twice")
        models[name] = _model_route(value_node, source, name)
    return Routing(models)


def dump(routing: Routing) -> str:
    """Return the YAML text of ``routing`` (what ``parse`` reads back to the same value)."""
    doc: dict[str, Any] = {}
    for name, route in sorted(routing.models.items()):
        entry: dict[str, Any] = {}
        if route.weights:
            entry["weights"] = {v: _number(w) for v, w in route.weights}
        if route.shadow is not None:
            entry["shadow"] = {"version": route.shadow.version,
                               "share": _number(route.shadow.share)}  # fmt: skip
        doc[name] = entry
    header = "# Written by ops/rollout/; see modelformat/routing.py for the format.\n"
    return header + (
        yaml.safe_dump(doc, sort_keys=True, default_flow_style=None) if doc else "{}\n"
    )


def _model_route(node: yaml.Node, source: str, name: str) -> ModelRoute:
    weights: dict[int, float] = {}
    shadow: Shadow | None = None
    for key_node, value_node in _mapping(node, source, f"model {name!r}"):
        key = _scalar(key_node, source, "a key")
        if key not in _MODEL_KEYS:
            raise _error(source, key_node, f"model {name!r}: unknown key {key!r} "
                                           f"(expected one of {list(_MODEL_KEYS)})")  # fmt: skip
        if key == "weights":
            for v_node, w_node in _mapping(value_node, source, f"weights of {name!r}"):
                version = _version(v_node, source, f"weights of {name!r}")
                if version in weights:
                    raise _error(source, v_node, f"weights of {name!r}: version {version} twice")
                weights[version] = _fraction(w_node, source, f"weight of {name!r} v{version}", None)
            if weights and not any(w > 0 for w in weights.values()):
                raise _error(source, value_node, f"weights of {name!r}: at least one must be > 0")
        else:
            shadow = _shadow(value_node, source, name)
    return ModelRoute(tuple(sorted(weights.items())), shadow)


def _shadow(node: yaml.Node, source: str, name: str) -> Shadow:
    fields: dict[str, Any] = {}
    for key_node, value_node in _mapping(node, source, f"shadow of {name!r}"):
        key = _scalar(key_node, source, "a key")
        if key not in _SHADOW_KEYS:
            raise _error(source, key_node, f"shadow of {name!r}: unknown key {key!r} "
                                           f"(expected one of {list(_SHADOW_KEYS)})")  # fmt: skip
        if key == "version":
            fields["version"] = _version(value_node, source, f"shadow of {name!r}")
        else:
            fields["share"] = _fraction(value_node, source, f"shadow share of {name!r}", 1.0)
    if "version" not in fields:
        raise _error(source, node, f"shadow of {name!r}: 'version' is required")
    return Shadow(**fields)


def _mapping(node: yaml.Node, source: str, what: str) -> list[tuple[yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise _error(source, node, f"{what} must be a mapping")
    return list(node.value)


def _scalar(node: yaml.Node, source: str, what: str) -> str:
    if not isinstance(node, yaml.ScalarNode) or node.value == "":
        raise _error(source, node, f"expected {what}")
    return str(node.value)


def _version(node: yaml.Node, source: str, what: str) -> int:
    text = _scalar(node, source, "a version")
    if not text.isdigit() or int(text) < 1:
        raise _error(source, node, f"{what}: a version is a positive integer, got {text!r}")
    return int(text)


def _fraction(node: yaml.Node, source: str, what: str, upper: float | None) -> float:
    text = _scalar(node, source, "a number")
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= 0 and (upper is None or value <= upper)) or value == float("inf"):
        limit = f"[0, {upper:g}]" if upper is not None else "a finite number ≥ 0"
        raise _error(source, node, f"{what} must be {limit}, got {text!r}")
    return value


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _error(source: str, node: yaml.Node, message: str) -> FormatError:
    return FormatError(f"{source} line {node.start_mark.line + 1}: {message}")

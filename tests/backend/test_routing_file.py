"""The routing file (modelformat/routing.py): format, line-numbered errors, sticky choice."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from modelformat import routing
from modelformat.errors import FormatError

GOOD = """\
# a canary at 5 %, shadowed in full
minilm-intent:
  weights: {1: 95, 3: 5}
  shadow: {version: 3, share: 1.0}
minilm:
  shadow:
    version: 2
"""


def test_a_routing_file_reads_back_to_what_it_says_and_dumps_to_the_same() -> None:
    parsed = routing.parse(GOOD)

    intent = parsed.route("minilm-intent")
    assert intent is not None and intent.weights == ((1, 95.0), (3, 5.0))
    assert intent.shadow == routing.Shadow(3, 1.0)
    assert parsed.route("minilm") == routing.ModelRoute((), routing.Shadow(2, 1.0))
    assert parsed.route("other") is None
    assert routing.parse(routing.dump(parsed)) == parsed


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "{}\n"])
def test_an_empty_routing_file_splits_nothing(text: str) -> None:
    assert routing.parse(text) == routing.EMPTY


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("m:\n  weights: {x: 1}\n", 2, "a version is a positive integer, got 'x'"),
        ("m:\n  weights:\n    0: 1\n", 3, "a version is a positive integer, got '0'"),
        ("m:\n  weights:\n    1: 5\n    2: -1\n", 4, "weight of 'm' v2 must be a finite number"),
        ("m:\n  weights: {1: .inf}\n", 2, "must be a finite number"),
        ("m:\n  weights: {1: 0, 2: 0}\n", 2, "at least one must be > 0"),
        ("m:\n  weights: {1: 1, 1: 2}\n", 2, "version 1 twice"),
        ("m:\n  shadow: {version: 2, share: 1.5}\n", 2, "must be [0, 1], got '1.5'"),
        ("m:\n  shadow: {share: 0.5}\n", 2, "'version' is required"),
        ("m:\n  shadow: {version: 2, sahre: 0.5}\n", 2, "unknown key 'sahre'"),
        ("m:\n  weight: {1: 1}\n", 2, "unknown key 'weight'"),
        ("m: [1, 2]\n", 1, "model 'm' must be a mapping"),
        ("m: {}\nm: {}\n", 2, "model 'm' is named twice"),
        ("m:\n  weights: {1: 1\n", 3, "not YAML"),
        ("- m\n", 1, "the file must be a mapping"),
    ],
)
def test_a_bad_routing_file_is_refused_naming_its_line(text: str, line: int, words: str) -> None:
    with pytest.raises(FormatError) as caught:
        routing.parse(text, source="routing.yaml")

    assert f"routing.yaml line {line}:" in str(caught.value)
    assert words in str(caught.value)


def test_a_routing_key_always_lands_on_the_same_version_and_the_keys_follow_the_weights() -> None:
    route = routing.parse("m: {weights: {1: 70, 2: 30}}").route("m")
    assert route is not None
    keys = [f"user-{i}" for i in range(20_000)]

    first = [route.choose(key, "m") for key in keys]
    again = [route.choose(key, "m") for key in keys]

    assert first == again
    share = Counter(first)[2] / len(keys)
    assert abs(share - 0.30) < 0.015  # 20,000 keys: 4.5 standard deviations is 0.015


def test_a_key_keeps_its_version_when_a_zero_weight_version_is_added() -> None:
    before = routing.parse("m: {weights: {1: 70, 2: 30}}").route("m")
    after = routing.parse("m: {weights: {1: 70, 2: 30, 9: 0}}").route("m")
    assert before is not None and after is not None

    assert all(before.choose(f"k{i}", "m") == after.choose(f"k{i}", "m") for i in range(2_000))


def test_without_a_key_the_split_is_random_by_weight() -> None:
    route = routing.parse("m: {weights: {1: 95, 3: 5}}").route("m")
    assert route is not None
    rng = random.Random(7)

    counts = Counter(route.choose(None, "m", rng) for _ in range(20_000))

    assert set(counts) == {1, 3}
    assert abs(counts[3] / 20_000 - 0.05) < 0.008  # 20,000 draws: 5 standard deviations


def test_a_shadow_is_never_the_version_that_served_and_follows_its_share() -> None:
    route = routing.parse("m: {weights: {1: 1}, shadow: {version: 3, share: 0.25}}").route("m")
    assert route is not None
    rng = random.Random(3)

    draws = [route.shadow_version(1, rng) for _ in range(20_000)]

    assert route.shadow_version(3, rng) is None
    assert set(draws) == {None, 3}
    assert abs(draws.count(3) / 20_000 - 0.25) < 0.02

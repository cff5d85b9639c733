"""The one rule every list of a request body goes through (docs/architecture.md: bounded cost).

Two steps, both before any pydantic validator sees the body:

1. ``load_bounded``: the body is parsed whole only when it holds at most ``value_limit`` strings,
   lists and objects (the values that cost a parser tens of bytes each: a 1 MiB body of ``[],``
   is 350,000 lists, 30 MiB). Counting them costs three ``bytes.count`` calls; a body over the
   quick count is counted exactly outside its strings (numpy, ~3 ms a MiB), and one really over
   is parsed only up to that many values, its open lists closed, so the rule below can still
   name its first bad item; past the rule it is a 413 naming the count.
2. ``check_list``: every list (texts, pairs, documents, token ids, lists of them, a speed per
   text, embedding types: ``LISTS`` says which, per request model) is counted against its limit
   before its first item is read, then read item by item in order, stopping at the first bad
   one, which the 400/413/422 names (``texts[3]``, ``input[1][0]``) with what was expected.

A number costs a parser little (a 1 MiB body of ids: 9-13 MiB, ~10 ms), so lists of numbers
are never cut: a list of token ids is counted against GATEWAY_MAX_TOKEN_IDS as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from backend.early_exit import valid_speed
from backend.errors import BadRequest, GatewayError, PayloadTooLarge, UnprocessableInput
from backend.settings import Settings

MAX_INT = 2**63 - 1  # pydantic's (and TF Serving's) int64
# Strings, lists and objects a body may hold: this many per GATEWAY_MAX_TEXTS, and a margin for
# the other fields (a pair is 3 values, a list of ids 1, a document object 3 and 2 per other
# field it carries: Cohere's and Jina's clients send some).
VALUES_PER_TEXT = 32
VALUES_MARGIN = 256
FIRST_WINDOW = 1 << 16
MAX_DEPTH = 16  # no route's body nests deeper than 4; a deeper one is cut here (and refused)


def value_limit(settings: Settings) -> int:
    """Return how many strings, lists and objects a body may hold."""
    return VALUES_PER_TEXT * settings.max_texts_per_request + VALUES_MARGIN


def values_message(settings: Settings) -> str:
    """Return the 413's message for a body of more strings, lists and objects than it may hold."""
    most = value_limit(settings)
    return (
        f"the body holds more than {most} strings, lists and objects, over the limit of {most} "
        f"({VALUES_PER_TEXT} per text of GATEWAY_MAX_TEXTS, and {VALUES_MARGIN})"
    )


def load_bounded(raw: bytes, most: int) -> tuple[Any, bool]:
    """Return (the JSON in ``raw``, whether it is whole): whole when it holds at most ``most``
    strings, lists and objects (or nests at most MAX_DEPTH deep), else its prefix of that many,
    cut at a value and closed; 400 for a body that is not JSON."""
    quick = raw.count(b'"') // 2 + raw.count(b"[") + raw.count(b"{")
    cut = None if quick <= most else _cut(raw, most)
    text = raw if cut is None else cut
    try:
        return orjson.loads(text), cut is None
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None


def _cut(raw: bytes, most: int) -> bytes | None:
    """Return ``raw`` cut before its (most + 1)-th string, list or object (or its first list or
    object past MAX_DEPTH), with its open lists and objects closed; None when it holds no more
    than ``most`` of them (their brackets and quotes were in strings) and nests no deeper.
    A hostile body reaches its cut in its first KiB: its first 64 KiB are read first."""
    for size in (FIRST_WINDOW, len(raw)):
        head = raw[:size]
        if b"\\" in head:  # an escaped backslash or quote: two bytes that are neither
            head = head.replace(b"\\\\", b"__").replace(b'\\"', b"__")
        chars = np.frombuffer(head, dtype=np.uint8)
        quotes = chars == ord('"')
        inside = np.bitwise_xor.accumulate(quotes.view(np.uint8)).view(bool)  # opening quotes too
        opens = ((chars == ord("[")) | (chars == ord("{"))) & ~inside
        starts = np.flatnonzero((quotes & inside) | opens)
        if len(starts) > most or size >= len(raw):
            break
    end = int(starts[most]) if len(starts) > most else len(raw)
    closes = ((chars == ord("]")) | (chars == ord("}"))) & ~inside
    stack: list[int] = []
    for position in np.flatnonzero((opens | closes)[:end]).tolist():
        if head[position] in b"[{":
            if len(stack) == MAX_DEPTH:
                end = position
                break
            stack.append(head[position])
        elif stack:
            stack.pop()
    if end == len(raw):
        return None
    cut = raw[:end].rstrip()
    if cut.endswith(b":"):  # a member whose value was cut: the member goes (its key too)
        key_start = head.rfind(b'"', 0, head.rfind(b'"', 0, len(cut)))
        cut = raw[:key_start].rstrip()
    if cut.endswith(b","):
        cut = cut[:-1]
    closers = {ord("["): b"]", ord("{"): b"}"}
    return cut + b"".join(closers[opened] for opened in reversed(stack))


@dataclass(frozen=True)
class Limits:
    """What a body's lists are held to: the settings, and whether the body was parsed whole (a
    cut body's lists may be longer than they read: their counts are said as 'at least')."""

    settings: Settings
    whole: bool = True


Checker = Callable[[Any, str, Limits], None]


@dataclass(frozen=True)
class Items:
    """What one list of a request holds: its items' name and check, and its limits."""

    noun: str  # its items counted, in messages: "texts", "token ids"
    item: Checker  # raises for a bad item at ``where`` (``field[i]``)
    most: Callable[[Settings], int]
    setting: str  # what ``most`` comes from, named when a list is over it
    over: type[GatewayError] = PayloadTooLarge
    least: int = 1  # an emptier list is a 422
    reserved: int = 0  # items the route adds to the count (a rerank's query)
    # an emptier list: 422 for the inputs (an empty list of texts), 400 for an option's list
    # (embedding types, output kinds, weights: a malformed option, as its wrong items are)
    empty: type[GatewayError] = UnprocessableInput


def check_list(value: Any, field: str, items: Items, limits: Limits) -> None:
    """The rule: 400 unless ``value`` is a list; 413 (or ``items.over``) when it holds more
    items than its limit, before any item is read; 422 when it holds fewer than it must; then
    each item in order, stopping at the first bad one (``field[i]``)."""
    if not isinstance(value, list):
        raise BadRequest(f"field '{field}' must be a list of {items.noun}, not {kind(value)}")
    most = items.most(limits.settings) - items.reserved
    count = len(value)
    if count > most:
        more = "" if limits.whole else "at least "
        query = " and the query" if items.reserved else ""
        raise items.over(
            f"field '{field}' has {more}{count} {items.noun}{query}, over the limit of "
            f"{most + items.reserved} ({items.setting})"
        )
    if count < items.least:
        raise items.empty(f"field '{field}' is empty: send at least one of its {items.noun}")
    check = items.item
    for index, item in enumerate(value):
        check(item, f"{field}[{index}]", limits)


def kind(value: Any) -> str:
    """Return what JSON value ``value`` is, for an error message ('a list', 'true', ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return f"the number {_short(value)}"
    return "a list" if isinstance(value, list) else "an object"


def _short(value: Any, limit: int = 40) -> str:
    """Return ``repr(value)`` cut to ``limit`` characters (it goes into an error message)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- items ---------------------------------------------------------------------------------------

# What "empty" means, the same for the gateway's check and the schema's pattern: no character
# outside JavaScript's \s (the class JSON Schema patterns use; Python's \s also has \x1c-\x1f).
BLANK = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
NOT_BLANK = f"[^{BLANK}]"
_NOT_BLANK = re.compile(NOT_BLANK)


def text(value: Any, where: str, limits: Limits) -> None:
    """422 unless ``value`` is a text: a string with a character that isn't blank, within
    GATEWAY_MAX_TEXT_CHARS."""
    if not isinstance(value, str):
        raise UnprocessableInput(f"{where} is {kind(value)}: give a text (a string)")
    if not _NOT_BLANK.search(value):
        raise UnprocessableInput(f"{where} is empty")
    most = limits.settings.max_text_chars
    if len(value) > most:
        raise UnprocessableInput(
            f"{where} has {len(value)} characters, over the limit of {most} "
            "(GATEWAY_MAX_TEXT_CHARS)"
        )


def is_token_id(value: Any) -> bool:
    """True for what the schema takes as a token id: an int, or a float with no fraction (JSON
    Schema's integer), from 0 to 2^63 - 1; never a bool."""
    kind_ = type(value)
    if kind_ is float:
        return bool(value.is_integer() and 0 <= value <= MAX_INT)
    return kind_ is int and 0 <= value <= MAX_INT


def token_id(value: Any, where: str, limits: Limits) -> None:
    """400 unless ``value`` is a token id."""
    if not is_token_id(value):
        raise BadRequest(
            f"field '{where}': {kind(value)} is not a token id (an integer from 0 to 2^63 - 1)"
        )


def _all_ids(values: list[Any]) -> bool:
    """True when every value is an int in range (C-speed: the usual list of ids)."""
    return not values or (
        set(map(type, values)) == {int} and min(values) >= 0 and max(values) <= MAX_INT
    )


def _ids(least: int) -> Checker:
    def id_list(value: Any, where: str, limits: Limits) -> None:
        """One input's token ids: a list of at most GATEWAY_MAX_TOKEN_IDS ids (a 422 past it)."""
        if not isinstance(value, list):
            raise BadRequest(f"field '{where}': give a list of token ids, not {kind(value)}")
        if least <= len(value) <= limits.settings.max_token_ids and _all_ids(value):
            return
        check_list(value, where, TOKEN_IDS if least else TOKEN_IDS_OR_NONE, limits)

    return id_list


def pair(value: Any, where: str, limits: Limits) -> None:
    """400 unless ``value`` is a list of two texts; then each as ``text`` (422)."""
    if not isinstance(value, list) or len(value) != 2:
        raise BadRequest(f"{where} must be a list of two texts [text_a, text_b]")
    text(value[0], f"{where}[0]", limits)
    text(value[1], f"{where}[1]", limits)


def document(value: Any, where: str, limits: Limits) -> None:
    """A rerank document: a text, or an object whose 'text' is one."""
    if isinstance(value, dict):
        text(value.get("text"), f"{where}.text", limits)
    elif isinstance(value, str):
        text(value, where, limits)
    else:
        raise UnprocessableInput(
            f"{where} is {kind(value)}: give a text, or an object with a 'text'"
        )


OUTPUT_TYPES = ("float", "int8", "uint8", "binary", "ubinary")


def output_type(value: Any, where: str, limits: Limits) -> None:
    """400 unless ``value`` names an embedding type."""
    if not isinstance(value, str) or value not in OUTPUT_TYPES:
        choices = ", ".join(OUTPUT_TYPES)
        raise BadRequest(f"field '{where}': {_short(value)} is not one of {choices}")


OUTPUT_KINDS = ("dense", "sparse", "multivector")  # modelformat/outputs.py's KINDS


def output_kind(value: Any, where: str, limits: Limits) -> None:
    """400 unless ``value`` names an output kind (:embed's ``outputs``)."""
    if not isinstance(value, str) or value not in OUTPUT_KINDS:
        raise BadRequest(
            f"field '{where}': {_short(value)} is not one of {', '.join(OUTPUT_KINDS)}"
        )


def weight(value: Any, where: str, limits: Limits) -> None:
    """400 unless ``value`` is a number (a rerank's score weights; pydantic checks the range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"field '{where}' is {kind(value)}: give a number")


def speed(value: Any, where: str, limits: Limits) -> None:
    """422 unless ``value`` is a speed, a number in [0, 1] (issue 11: one status for every bad
    speed, wrong types included)."""
    if not valid_speed(value):
        raise UnprocessableInput(f"{where} is {_short(value)}: not a number in [0, 1]")


def _texts_limit(settings: Settings) -> int:
    return settings.max_texts_per_request


def _ids_limit(settings: Settings) -> int:
    return settings.max_token_ids


TEXTS = Items("texts", text, _texts_limit, "GATEWAY_MAX_TEXTS")
PAIRS = Items("pairs", pair, _texts_limit, "GATEWAY_MAX_TEXTS")
DOCUMENTS = Items("documents", document, _texts_limit, "GATEWAY_MAX_TEXTS", reserved=1)
TOKEN_IDS = Items("token ids", token_id, _ids_limit, "GATEWAY_MAX_TOKEN_IDS", UnprocessableInput)
TOKEN_IDS_OR_NONE = Items(
    "token ids", token_id, _ids_limit, "GATEWAY_MAX_TOKEN_IDS", UnprocessableInput, least=0
)
ID_LISTS = Items("lists of token ids", _ids(1), _texts_limit, "GATEWAY_MAX_TEXTS")
ID_LISTS_OR_EMPTY = Items("lists of token ids", _ids(0), _texts_limit, "GATEWAY_MAX_TEXTS")
OUTPUTS = Items("output kinds", output_kind, lambda _: len(OUTPUT_KINDS), "one of each kind",
                BadRequest, empty=BadRequest)  # fmt: skip
WEIGHTS = Items("weights", weight, lambda _: 3, "[dense, sparse, colbert]", BadRequest,
                empty=BadRequest)  # fmt: skip
EMBEDDING_TYPES = Items(
    "embedding types",
    output_type,
    lambda _: len(OUTPUT_TYPES),
    "one of each type",
    BadRequest,
    empty=BadRequest,
)


# -- fields ------------------------------------------------------------------------------------


def texts_field(value: Any, field: str, limits: Limits) -> None:
    """A list of texts."""
    check_list(value, field, TEXTS, limits)


def pairs_field(value: Any, field: str, limits: Limits) -> None:
    """A list of sentence pairs."""
    check_list(value, field, PAIRS, limits)


def ids_field(value: Any, field: str, limits: Limits) -> None:
    """A list of lists of token ids (an empty one is an empty text)."""
    check_list(value, field, ID_LISTS_OR_EMPTY, limits)


def documents_field(value: Any, field: str, limits: Limits) -> None:
    """A rerank's documents (the query counts against GATEWAY_MAX_TEXTS too)."""
    check_list(value, field, DOCUMENTS, limits)


def query_field(value: Any, field: str, limits: Limits) -> None:
    """A rerank's query: one text."""
    text(value, f"field '{field}'", limits)


def embedding_types_field(value: Any, field: str, limits: Limits) -> None:
    """Embedding types (null: the default)."""
    if value is not None:
        check_list(value, field, EMBEDDING_TYPES, limits)


def outputs_field(value: Any, field: str, limits: Limits) -> None:
    """:embed's output kinds (null: the model's default)."""
    if value is not None:
        check_list(value, field, OUTPUTS, limits)


def weights_field(value: Any, field: str, limits: Limits) -> None:
    """A rerank's score weights (null: none)."""
    if value is not None:
        check_list(value, field, WEIGHTS, limits)


def text_or_texts(value: Any, field: str, limits: Limits) -> None:
    """A text or a list of texts (TEI's ``inputs``)."""
    if isinstance(value, str):
        text(value, f"field '{field}'", limits)
    else:
        check_list(value, field, TEXTS, limits)


def openai_input(value: Any, field: str, limits: Limits) -> None:
    """OpenAI's input: a text, a list of texts, one input's token ids, or lists of them; the
    list's first item says which, and the rule names the first item that does not fit."""
    if isinstance(value, str):
        text(value, f"field '{field}'", limits)
        return
    if not isinstance(value, list):
        raise BadRequest(
            f"field '{field}' must be a text, a list of texts, a list of token ids or a list of "
            f"lists of token ids, not {kind(value)}"
        )
    first = value[0] if value else ""
    if isinstance(first, str):
        check_list(value, field, TEXTS, limits)
    elif isinstance(first, list):
        check_list(value, field, ID_LISTS, limits)
    elif isinstance(first, int | float) and not isinstance(first, bool):
        _ids(1)(value, field, limits)
    else:
        raise BadRequest(
            f"field '{field}[0]' is {kind(first)}: give a text, a token id or a list of token ids"
        )


def openai_inputs(value: Any) -> tuple[list[str], list[list[int]] | None]:
    """Return OpenAI's validated input as (texts, None) or ([], lists of token ids)."""
    if isinstance(value, str):
        return [value], None
    if isinstance(value[0], list):
        return [], [[int(i) for i in ids] for ids in value]
    if not isinstance(value[0], str):
        return [], [[int(i) for i in value]]
    return list(value), None


def speed_field(value: Any, field: str, limits: Limits, count: int) -> None:
    """A speed: one number, or a list of one per text (422 otherwise: issue 11)."""
    if isinstance(value, list):
        if len(value) != count:
            raise UnprocessableInput(
                f"field '{field}' has {'' if limits.whole else 'at least '}{len(value)} values "
                f"for {count} texts: give one per text, or one number for all"
            )
        for index, item in enumerate(value):
            speed(item, f"{field}[{index}]", limits)
    elif value is not None and not valid_speed(value):
        raise UnprocessableInput(
            f"field 'speed' is {_short(value)}: give a number in [0, 1] "
            "or a list of them, one per text"
        )

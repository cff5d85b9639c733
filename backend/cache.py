"""The result cache: each text's tokens and model rows, kept per worker (stage ``cache``).

The stage runs after resolve (the key's reach checked, the served version and its assets
known) and before tokenize (backend/service.py, ``Gateway._cached_stages``). What it keeps per
text is what tokenize and the model server made of it: the ``Encoded`` row and the model's
output rows. The route's post-processing (labels, top_k, normalize, output types, sparse
limits) runs on every answer, hit or miss, so the answer of a hit is the uncached answer byte
for byte, and options that only post-process are not in the key (they do not decide what is
kept).

A key is ``(scope, model, served version, the route's inputs key, the outputs held, text)``:
everything the entry depends on. The served version is a number (never a label: a label move,
a rollback or a new version is a new key, never an old answer); the route's inputs key holds
every option that decides the tokens and the model's rows (prompt, input type, truncation side,
ColBERT/query side, speed, ...); the outputs held are the signature outputs the model-server
call was narrowed to (a dense-only request of a hybrid model asks for its dense output alone:
its entry can't answer a sparse request, issue 60 item 3); the scope is the API key's name
unless GATEWAY_CACHE_SHARED_KEYS (a hit answers faster than a miss: shared entries let one key
learn whether another sent a text).

Bounded: the entries' bytes (GATEWAY_CACHE_BYTES, least recently used first out), each entry's
(GATEWAY_CACHE_ENTRY_BYTES: a bigger one is computed and not kept) and their count
(GATEWAY_CACHE_ENTRIES). Concurrent misses of one key in a worker are computed once: the first
request claims the key, the others wait for it (until their deadline) and then read it. A
request's claims are a ``Claim`` made before the lookup and released in a ``finally`` (a claim
left behind would make every later request for its text wait its whole deadline), and a release
ends only the flights that request claimed.

The shared tier (``SharedTier``, GATEWAY_CACHE_REDIS): Redis behind every worker's tier, so a
text one worker or pod computed is a hit in the others. The texts a worker's tier misses are read
in one MGET; its hits fill the worker's tier; the texts computed are written in one pipeline of
``PSETEX name ttl value`` (the ACL's cache user may write no other way: every entry expires). A
name is the prefix and the BLAKE2b digest of the whole key (the same scope, model, served
version, inputs key, outputs and text) and of ``SEMANTICS`` (this gateway's version of what an
entry means, with the tokenizers library's version and the value format: pods of a rolling
upgrade that changes answers never read each other's entries); a value is the entry's tokens and
rows, the arrays' raw bytes after a small JSON header (``encode``: never pickle, which would run
what a Redis holds), at most the entry bound; read back, its arrays are copied out of it (what a
worker keeps is what it counts). Every call waits at most GATEWAY_CACHE_REDIS_TIMEOUT_S; one that
fails or times out is counted (``gateway_cache_errors_total{tier="redis"}``), and the worker
skips the tier for GATEWAY_CACHE_REDIS_RETRY_S (``gateway_cache_degraded``): the texts are
computed and nothing fails, and a Redis down costs requests nothing.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import orjson
import tokenizers

from backend import metrics
from backend.redisconn import RedisConn
from backend.tokenization import Encoded

log = logging.getLogger(__name__)

TIER = "local"
SHARED_TIER = "redis"
Key = tuple[Hashable, ...]

# Bump when what an entry holds or how the gateway makes it changes (tokenization, the encoders'
# prompts and markers, the outputs asked, the key's fields): the shared tier's names hold it, so
# pods of a rolling upgrade never serve each other's entries. 2: the key holds the outputs held.
SEMANTICS = 2


@dataclass(frozen=True, slots=True)
class Entry:
    """One text's tokens and its rows of each model output."""

    encoded: Encoded
    rows: dict[str, np.ndarray]
    size: int  # bytes it holds (key included), for the bound


def entry_of(key: Key, encoded: Encoded, rows: dict[str, np.ndarray]) -> Entry:
    """Return the entry of ``key``'s text (its rows copied: nothing shared with the request)."""
    kept = {name: np.array(row, copy=True) for name, row in rows.items()}
    return Entry(encoded, kept, _size(key, encoded, kept))


def _size(key: Key, encoded: Encoded, rows: dict[str, np.ndarray]) -> int:
    """Return the bytes an entry of these parts holds (each array owning its data)."""
    size = sum(sys.getsizeof(part) for part in key) + 200  # the tuples, dicts and the Entry
    size += sum(row.nbytes + 112 for row in rows.values()) + encoded.ids.nbytes + 112
    for extra in (encoded.type_ids, encoded.attention):
        if extra is not None:
            size += extra.nbytes + 112
    return size


def stack(entries: Sequence[Entry]) -> dict[str, np.ndarray]:
    """Return the entries' rows as each output's batch, in their order; rows of per-position
    outputs (token weights) computed in chunks of other lengths are padded with zeros to the
    longest, as backend/bucketing.py's reassemble pads per-token outputs (each row's own
    token count says what is real)."""
    outputs = {}
    for name in entries[0].rows:
        rows = [entry.rows[name] for entry in entries]
        shape = rows[0].shape
        if any(row.shape != shape for row in rows):
            longest = tuple(max(sizes) for sizes in zip(*(row.shape for row in rows), strict=True))
            rows = [np.pad(row, [(0, want - have) for have, want in zip(row.shape, longest,
                                                                      strict=True)])
                    for row in rows]  # fmt: skip
        outputs[name] = np.stack(rows)
    return outputs


# a value: this, the header's length, the JSON header, then each array's bytes in its order
_FORMAT = b"bgc1"
_LENGTH = struct.Struct("<I")
# what the shared tier's names hold besides the key: an entry made by another tokenizers
# release or another value format is another entry
_SEMANTICS = (SEMANTICS, tokenizers.__version__, _FORMAT.decode())


def encode(entry: Entry) -> bytes:
    """Return ``entry`` as the shared tier's value: its flags, then its arrays' raw bytes."""
    arrays: list[tuple[str, np.ndarray]] = [("ids", entry.encoded.ids)]
    for name in ("type_ids", "attention"):
        extra = getattr(entry.encoded, name)
        if extra is not None:
            arrays.append((name, extra))
    arrays.extend((f"row:{name}", row) for name, row in entry.rows.items())
    header = orjson.dumps({
        "truncated": entry.encoded.truncated, "full_length": entry.encoded.full_length,
        "arrays": [[name, array.dtype.str, array.shape] for name, array in arrays],
    })  # fmt: skip
    parts = [_FORMAT, _LENGTH.pack(len(header)), header]
    parts.extend(np.ascontiguousarray(array).tobytes() for _, array in arrays)
    return b"".join(parts)


def decode(key: Key, value: bytes) -> Entry:
    """Return the entry that ``encode`` made ``value`` of; ValueError for anything else. Each
    array is copied out of ``value`` once (a view would keep the whole value alive beside the
    copies, twice the bytes counted)."""
    if value[:4] != _FORMAT:
        raise ValueError("not an entry of this format")
    start = 4 + _LENGTH.size
    (length,) = _LENGTH.unpack_from(value, 4)
    header = orjson.loads(value[start : start + length])
    offset = start + length
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, shape in header["arrays"]:
        kind = np.dtype(dtype)
        if kind.hasobject:
            raise ValueError("an entry holds numbers only")
        count = int(np.prod(shape, dtype=np.int64))
        arrays[name] = np.frombuffer(value, kind, count, offset).reshape(shape).copy()
        offset += count * kind.itemsize
    if offset != len(value):
        raise ValueError("the entry's length does not match its header")
    encoded = Encoded(
        arrays.pop("ids"), bool(header["truncated"]), int(header["full_length"]),
        arrays.pop("type_ids", None), arrays.pop("attention", None),
    )  # fmt: skip
    rows = {name.removeprefix("row:"): row for name, row in arrays.items()}
    return Entry(encoded, rows, _size(key, encoded, rows))


class SharedTier:
    """The result cache's tier in Redis, shared by every worker and pod that names it."""

    def __init__(
        self, url: str, prefix: str, ttl_s: float, timeout_s: float, retry_s: float,
        max_entry_bytes: int,
    ) -> None:  # fmt: skip
        self._redis = RedisConn(url, timeout_s, retry_s)
        self.prefix = prefix
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self.retry_s = retry_s
        self.max_entry_bytes = max_entry_bytes
        self._hits = metrics.child(metrics.CACHE_LOOKUPS, SHARED_TIER, "hit")
        self._misses = metrics.child(metrics.CACHE_LOOKUPS, SHARED_TIER, "miss")
        self._read = metrics.child(metrics.CACHE_TRANSFER_BYTES, SHARED_TIER, "read")
        self._written = metrics.child(metrics.CACHE_TRANSFER_BYTES, SHARED_TIER, "write")
        self._too_big = metrics.child(metrics.CACHE_NOT_STORED, SHARED_TIER, "too_big")
        self._skipped = metrics.child(metrics.CACHE_NOT_STORED, SHARED_TIER, "degraded")
        self._failures = metrics.child(metrics.CACHE_ERRORS, SHARED_TIER)
        self._degraded = metrics.child(metrics.CACHE_DEGRADED, SHARED_TIER)
        self._degraded.set(0)

    def name(self, key: Key) -> str:
        """Return ``key``'s name in Redis: the prefix and the digest of the whole key and of
        this gateway's semantics."""
        named = repr((_SEMANTICS, key)).encode()
        return self.prefix + hashlib.blake2b(named, digest_size=20).hexdigest()

    @property
    def degraded(self) -> bool:
        """Whether the tier is being skipped after an error."""
        return self._redis.down

    def fetch(self, keys: Sequence[Key]) -> list[Entry | None] | None:
        """Return each key's entry (None: a miss), read in one MGET; None when the tier is
        skipped (after an error, for ``retry_s``) or fails now."""
        if self.degraded:
            return None
        try:
            values = self._redis.client.mget([self.name(key) for key in keys])
        except self._redis.errors as exc:
            self._failed(exc)
            return None
        self._answered()
        found: list[Entry | None] = []
        for key, value in zip(keys, values, strict=True):
            entry = None
            if isinstance(value, bytes):  # never str: the client does not decode answers
                self._read.inc(len(value))
                try:
                    entry = decode(key, value)
                except (ValueError, TypeError, LookupError, ArithmeticError, struct.error) as exc:
                    self._failures.inc()  # not ours, or another format's: computed again
                    log.warning("result cache: an entry in Redis does not decode (%s)", exc)
            found.append(entry)
        hits = sum(entry is not None for entry in found)
        if hits:
            self._hits.inc(hits)
        if len(found) > hits:
            self._misses.inc(len(found) - hits)
        return found

    def store(self, items: Sequence[tuple[Key, Entry]]) -> None:
        """Write the entries (those within the entry bound) in one pipeline of PSETEX (SET ...
        PX ttl: the only write the cache's Redis user may run, so no entry is ever written
        without its expiry); nothing when the tier is skipped or fails."""
        if self.degraded:
            self._skipped.inc(len(items))
            return
        values = []
        for key, entry in items:
            value = encode(entry) if entry.size <= self.max_entry_bytes else None
            if value is None or len(value) > self.max_entry_bytes:
                self._too_big.inc()
                continue
            values.append((self.name(key), value))
        if not values:
            return
        try:
            pipe = self._redis.client.pipeline(transaction=False)
            for name, value in values:
                pipe.psetex(name, self.ttl_ms, value)
            pipe.execute()
        except self._redis.errors as exc:
            self._failed(exc)
            return
        self._answered()
        self._written.inc(sum(len(value) for _, value in values))

    def _failed(self, exc: BaseException) -> None:
        """Count the failure and skip the tier for ``retry_s``."""
        self._failures.inc()
        self._degraded.set(1)
        if self._redis.failed():
            log.warning("result cache: Redis fails (%s); skipping it for %.0f s at a time",
                        exc, self.retry_s)  # fmt: skip

    def _answered(self) -> None:
        """Mark the tier healthy again after a failure."""
        if self._redis.answered():
            self._degraded.set(0)
            log.warning("result cache: Redis answers again; its tier is used again")

    def close(self) -> None:
        """Close the client's connections."""
        self._redis.client.close()


class ResultCache:
    """A worker's LRU of entries, bounded in bytes, per entry and in count; single flight;
    the shared tier behind it, when there is one."""

    def __init__(
        self, max_bytes: int, max_entry_bytes: int, max_entries: int,
        shared: SharedTier | None = None,
    ) -> None:  # fmt: skip
        self.shared = shared
        self.max_bytes = max_bytes
        self.max_entry_bytes = min(max_entry_bytes, max_bytes)
        self.max_entries = max_entries
        self._entries: OrderedDict[Key, Entry] = OrderedDict()
        self._bytes = 0
        self._flights: dict[Key, threading.Event] = {}
        self._lock = threading.Lock()
        self._hits = metrics.child(metrics.CACHE_LOOKUPS, TIER, "hit")
        self._misses = metrics.child(metrics.CACHE_LOOKUPS, TIER, "miss")
        self._evictions = metrics.child(metrics.CACHE_EVICTIONS, TIER)
        self._too_big = metrics.child(metrics.CACHE_NOT_STORED, TIER, "too_big")
        self._bytes_gauge = metrics.child(metrics.CACHE_BYTES, TIER)
        self._count_gauge = metrics.child(metrics.CACHE_ENTRIES, TIER)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """Bytes the entries hold."""
        return self._bytes

    def lookup(
        self, keys: Sequence[Key], claim: Claim | None
    ) -> tuple[list[Entry | None], list[int], list[tuple[int, threading.Event]]]:
        """Return each key's entry (None: a miss), the misses this request computes (claimed
        in ``claim``, when given) and the misses another request is computing (with its
        event)."""
        found: list[Entry | None] = []
        mine: list[int] = []
        theirs: list[tuple[int, threading.Event]] = []
        with self._lock:
            entries, flights = self._entries, self._flights
            for index, key in enumerate(keys):
                entry = entries.get(key)
                found.append(entry)
                if entry is not None:
                    entries.move_to_end(key)
                    continue
                flight = flights.get(key)
                if flight is not None and claim is not None:
                    theirs.append((index, flight))
                    continue
                if claim is not None:
                    # recorded in the claim under the lock: no moment where a flight is
                    # claimed and its request could fail to release it
                    flights[key] = claim.flights[key] = threading.Event()
                mine.append(index)
        hits = len(keys) - len(mine) - len(theirs)
        if hits:
            self._hits.inc(hits)
        if len(keys) > hits:
            self._misses.inc(len(keys) - hits)
        return found, mine, theirs

    def get(self, key: Key) -> Entry | None:
        """Return ``key``'s entry (after waiting on another request's computation)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: Key, entry: Entry) -> None:
        """Keep ``entry`` (unless it is over the entry bound), evicting the least recently
        used entries past the bounds."""
        if entry.size > self.max_entry_bytes:
            self._too_big.inc()
            return
        evicted = 0
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            self._entries[key] = entry
            self._bytes += entry.size
            while self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
                _, gone = self._entries.popitem(last=False)
                self._bytes -= gone.size
                evicted += 1
            size, count = self._bytes, len(self._entries)
        if evicted:
            self._evictions.inc(evicted)
        self._bytes_gauge.set(size)
        self._count_gauge.set(count)

    def fill(
        self, keys: Sequence[Key], found: list[Entry | None], mine: list[int], claim: Claim
    ) -> list[int]:
        """Return the misses ``mine`` left after the shared tier: its hits go into ``found`` and
        this tier, and their flights (in ``claim``) end: their waiters read them."""
        shared = self.shared
        if shared is None or not mine:
            return mine
        fetched = shared.fetch([keys[i] for i in mine])
        if fetched is None:
            return mine
        left, filled = [], []
        for index, entry in zip(mine, fetched, strict=True):
            if entry is None:
                left.append(index)
                continue
            found[index] = entry
            self.put(keys[index], entry)
            filled.append(keys[index])
        self.release(claim, filled)
        return left

    def keep(self, items: Sequence[tuple[Key, Entry]]) -> None:
        """Keep the computed entries in this tier and write them to the shared tier."""
        for key, entry in items:
            self.put(key, entry)
        if self.shared is not None and items:
            self.shared.store(items)

    def close(self) -> None:
        """Close the shared tier's client."""
        if self.shared is not None:
            self.shared.close()

    def release(self, claim: Claim, keys: Sequence[Key] | None = None) -> None:
        """End the flights of ``claim`` (those of ``keys`` only, when given): their waiters read
        them. Safe to call again: a flight ends once, and never one another request claimed
        since."""
        names = list(claim.flights) if keys is None else keys
        events = []
        with self._lock:
            for key in names:
                event = claim.flights.pop(key, None)
                if event is not None and self._flights.get(key) is event:
                    del self._flights[key]
                if event is not None:
                    events.append(event)
        for event in events:
            event.set()


class Claim:
    """The flights one request claimed in a worker's cache (``ResultCache.lookup``): made before
    the lookup, released in a ``finally``."""

    __slots__ = ("flights",)

    def __init__(self) -> None:
        self.flights: dict[Key, threading.Event] = {}

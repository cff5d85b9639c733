"""The result cache: each text's tokens and model rows, kept per worker (stage ``cache``).

The stage runs after resolve (the key's reach checked, the served version and its assets
known) and before tokenize (backend/service.py, ``Gateway._cached_stages``). What it keeps per
text is what tokenize and the model server made of it: the ``Encoded`` row and the model's
output rows. The route's post-processing (labels, top_k, normalize, output types, sparse
limits) runs on every answer, hit or miss, so the answer of a hit is the uncached answer byte
for byte, and options that only post-process are not in the key (they do not decide what is
kept).

A key is ``(scope, model, served version, the route's inputs key, text)``: the served version
is a number (never a label: a label move, a rollback or a new version is a new key, never an
old answer); the route's inputs key holds every option that decides the tokens and the model's
rows (prompt, input type, truncation side, ColBERT/query side, speed, ...); the scope is the
API key's name unless GATEWAY_CACHE_SHARED_KEYS (a hit answers faster than a miss: shared
entries let one key learn whether another sent a text).

Bounded: the entries' bytes (GATEWAY_CACHE_BYTES, least recently used first out), each entry's
(GATEWAY_CACHE_ENTRY_BYTES: a bigger one is computed and not kept) and their count
(GATEWAY_CACHE_ENTRIES). Concurrent misses of one key in a worker are computed once: the first
request claims the key, the others wait for it (until their deadline) and then read it.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from backend import metrics
from backend.tokenization import Encoded

TIER = "local"
Key = tuple[Hashable, ...]


@dataclass(frozen=True, slots=True)
class Entry:
    """One text's tokens and its rows of each model output."""

    encoded: Encoded
    rows: dict[str, np.ndarray]
    size: int  # bytes it holds (key included), for the bound


def entry_of(key: Key, encoded: Encoded, rows: dict[str, np.ndarray]) -> Entry:
    """Return the entry of ``key``'s text (its rows copied: nothing shared with the request)."""
    kept = {name: np.array(row, copy=True) for name, row in rows.items()}
    size = sum(sys.getsizeof(part) for part in key) + 200  # the tuples, dicts and the Entry
    size += sum(row.nbytes + 112 for row in kept.values()) + encoded.ids.nbytes + 112
    for extra in (encoded.type_ids, encoded.attention):
        if extra is not None:
            size += extra.nbytes + 112
    return Entry(encoded, kept, size)


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


class ResultCache:
    """A worker's LRU of entries, bounded in bytes, per entry and in count; single flight."""

    def __init__(self, max_bytes: int, max_entry_bytes: int, max_entries: int) -> None:
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
        self, keys: Sequence[Key], claim: bool
    ) -> tuple[list[Entry | None], list[int], list[tuple[int, threading.Event]]]:
        """Return each key's entry (None: a miss), the misses this request computes (claimed
        when ``claim``) and the misses another request is computing (with its event)."""
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
                if flight is not None and claim:
                    theirs.append((index, flight))
                    continue
                if claim:
                    flights[key] = threading.Event()
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

    def release(self, keys: Sequence[Key]) -> None:
        """End the flights of ``keys`` (claimed by this request): their waiters read them."""
        with self._lock:
            events = [self._flights.pop(key, None) for key in keys]
        for event in events:
            if event is not None:
                event.set()

"""Add, list and remove the gateway's API keys (GATEWAY_API_KEYS_FILE), stored hashed.

  python -m ops.apikeys --file keys.json add team-a --models minilm --rate 10 --burst 20
  python -m ops.apikeys --file keys.json add canary-testers --versions public,canary
  python -m ops.apikeys --file keys.json add ops --versions '*'
  python -m ops.apikeys --file keys.json list
  python -m ops.apikeys --file keys.json remove team-a

``add`` prints the new key once (it is not stored, only its SHA-256: lose it and add another).
The file is rewritten atomically under a lock, so running gateways pick it up within
GATEWAY_LABELS_CACHE_S and never read half of it. ``--versions`` is the key's scope
(backend/auth.py): ``public`` (the default: the public labels and vetted version numbers), label
names, version numbers, or ``*`` for every version, unvetted ones included.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path
from typing import Any

import orjson

from backend.auth import key_hash, parse_keys
from modelformat import serverconfig

PREFIX = "bg-"


def load(path: Path) -> list[dict[str, Any]]:
    """Return the file's entries ([] when it does not exist); ValueError if it is broken."""
    if not path.exists():
        return []
    data = path.read_bytes()
    parse_keys(data)  # validates
    entries: list[dict[str, Any]] = orjson.loads(data)["keys"]
    return entries


def save(path: Path, entries: list[dict[str, Any]]) -> None:
    text = orjson.dumps({"keys": entries}, option=orjson.OPT_INDENT_2).decode() + "\n"
    serverconfig.write_text_atomic(path, text)


def add(path: Path, name: str, models: list[str] | None, rate: float | None,
        burst: float | None, versions: list[str | int] | None = None) -> str:  # fmt: skip
    """Add a key named ``name``; return the key (shown once, stored only as its hash)."""
    key = PREFIX + secrets.token_urlsafe(32)
    with serverconfig.config_lock(path, timeout_s=30):
        entries = load(path)
        if any(e["name"] == name for e in entries):
            raise ValueError(f"a key named {name!r} exists: remove it first")
        entry: dict[str, Any] = {"name": name, "sha256": key_hash(key)}
        if models:
            entry["models"] = models
        if rate is not None:
            entry["rate"] = rate
            entry["burst"] = burst if burst is not None else max(1.0, rate)
        if versions is not None:
            entry["versions"] = versions
        parse_keys(orjson.dumps({"keys": [*entries, entry]}))  # the gateway's rules, before saving
        save(path, [*entries, entry])
    return key


def remove(path: Path, name: str) -> None:
    with serverconfig.config_lock(path, timeout_s=30):
        entries = load(path)
        kept = [e for e in entries if e["name"] != name]
        if len(kept) == len(entries):
            raise ValueError(f"no key named {name!r}")
        save(path, kept)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--file", type=Path, required=True, help="the GATEWAY_API_KEYS_FILE")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("add", help="add a key and print it once")
    a.add_argument("name")
    a.add_argument("--models", help="comma-separated models it may use (default: all)")
    a.add_argument("--rate", type=float, help="requests per second (default: no limit)")
    a.add_argument(
        "--burst",
        type=float,
        help="requests at once above the rate, at least 1 (default: rate, at least 1)",
    )
    a.add_argument("--versions", help="comma-separated scope: public, labels, version numbers, "
                   "or * (default: public)")  # fmt: skip
    sub.add_parser("list", help="show the keys' names, models and limits")
    r = sub.add_parser("remove", help="remove a key")
    r.add_argument("name")
    args = p.parse_args(argv)
    try:
        if args.command == "add":
            if (args.rate is not None and args.rate <= 0) or (
                args.burst is not None and args.burst < 1
            ):
                p.error("--rate must be positive and --burst at least 1")
            models = (
                [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
            )
            versions = (
                [int(v) if v.strip().isdigit() else v.strip()
                 for v in args.versions.split(",") if v.strip()]
                if args.versions is not None else None
            )  # fmt: skip
            print(add(args.file, args.name, models, args.rate, args.burst, versions))
        elif args.command == "list":
            for e in load(args.file):
                limit = f"{e['rate']:g}/s burst {e['burst']:g}" if "rate" in e else "no limit"
                scope = ",".join(map(str, e.get("versions", ["public"])))
                print(f"{e['name']}\tmodels: {','.join(e.get('models', [])) or 'all'}\t{limit}"
                      f"\tversions: {scope}")  # fmt: skip
        else:
            remove(args.file, args.name)
    except (ValueError, OSError) as exc:
        print(f"apikeys: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

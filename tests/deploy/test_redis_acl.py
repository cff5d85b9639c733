"""The Kubernetes base's Redis (deploy/k8s/base/redis.yaml) run for real with its own arguments
(issue 41 item 5): it lets in only its two users, with the Secret's password, each allowed what
one job runs and refused the other's keys and commands (issue 60 item 7): "gateway", the rate
limiter (of Lua, its script alone, by EVAL of its text or EVALSHA of its hash: no SCRIPT LOAD,
so no other Lua is ever compiled; issue 48 item 3), and "gateway-cache", the result cache's shared
tier (MGET and PSETEX, a write that always expires, on its prefix's keys: issue 50); and the
token-bucket script clamps a bucket at both ends, whatever its hash holds. The gateways
themselves run against this Redis in tests/backend/test_ratelimit_redis.py and
test_result_cache_redis.py."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from backend.cache import SharedTier, entry_of
from backend.ratelimit import _TAKE, PREFIX, PodStore, RedisStore, _bucket_id
from backend.settings import Settings
from backend.tokenization import Encoded
from ops.procs import ServerProcess, free_port
from tests.backend.test_ratelimit_redis import manifest_args as base_args
from tests.backend.test_ratelimit_redis import redis_server_binary

RATE_USER, CACHE_USER = "gateway", "gateway-cache"


def manifest_args(password: str, port: int, data: Path) -> list[str]:
    """Return redis.yaml's redis-server command line, as Kubernetes expands it, on ``port``."""
    return [*base_args(password), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """Yield the port and the gateway user's password of redis.yaml's Redis."""
    redis_server_binary()
    data = tmp_path_factory.mktemp("redis-acl")
    password, port = secrets.token_hex(16), free_port()
    process = ServerProcess(manifest_args(password, port, data), data / "redis.log")

    def ready() -> bool:
        try:
            return bool(redis.Redis(port=port, username="gateway", password=password).ping())
        except redis.RedisError:
            return False

    process.wait_until(ready, 30)
    yield port, password
    process.stop()


def test_only_the_gateways_users_with_the_password_get_in(server: tuple[int, str]) -> None:
    port, password = server
    once = {"retry": Retry(NoBackoff(), 0)}  # a refused login is not retried (redis-py: 3 times)
    with pytest.raises(redis.AuthenticationError):  # the default user is off: NOAUTH
        redis.Redis(port=port, **once).ping()
    for user in (RATE_USER, CACHE_USER):
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, username=user, password="guess", **once).ping()
        assert redis.Redis(port=port, username=user, password=password, **once).ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port, username="default", password=password, **once).ping()


def test_the_rate_limiter_works_as_the_gateway_user(server: tuple[int, str]) -> None:
    port, password = server
    store = RedisStore(f"redis://gateway:{password}@127.0.0.1:{port}/0", fallback=None)  # type: ignore[arg-type]
    waits = [store.take("team-acl", 1.0, 3.0) for _ in range(4)]
    assert waits[:3] == [0.0, 0.0, 0.0] and waits[3] > 0.5


def test_a_refused_login_costs_the_rate_limiter_one_try_not_retries(
    server: tuple[int, str], tmp_path: Path
) -> None:
    port, _ = server
    store = RedisStore(f"redis://gateway:guess@127.0.0.1:{port}/0", PodStore(str(tmp_path)))
    started = time.perf_counter()
    wait = store.take("team-wrong-password", 1.0, 3.0)  # the pod's own bucket answers
    assert wait == 0.0 and time.perf_counter() - started < 1.0  # redis-py's retries: 4 s


CACHE = Settings.cache_redis_prefix  # the default prefix: the ACL's selector names it


def test_the_result_caches_shared_tier_works_as_its_user_and_every_entry_expires(
    server: tuple[int, str],
) -> None:
    port, password = server
    tier = SharedTier(f"redis://{CACHE_USER}:{password}@127.0.0.1:{port}/0", CACHE, 0.3, 0.25,
                      5.0, 100_000)  # fmt: skip
    keys = [("", "m", 1, ("embed",), "a text"), ("", "m", 1, ("embed",), "another")]
    entry = entry_of(keys[0], Encoded(np.arange(3, dtype=np.int32), False, 3),
                     {"embedding": np.ones(4, dtype=np.float32)})  # fmt: skip
    tier.store([(keys[0], entry)])
    found = tier.fetch(keys)
    time.sleep(0.5)  # past the tier's TTL: PSETEX, the one write its user has, always expires
    gone = tier.fetch(keys[:1])
    tier.close()
    assert found is not None and found[1] is None and not tier.degraded
    assert found[0] is not None and found[0].rows["embedding"].tolist() == [1.0] * 4
    assert gone == [None] and not tier.degraded


# Each user's commands, on its own keys: the other user is refused every one of them
RATE_OWN = [
    ("EVALSHA", hashlib.sha1(_TAKE.encode()).hexdigest(), "1", PREFIX + "x", "1", "3"),
    ("EVAL", _TAKE, "1", PREFIX + "x", "1", "3"),
    ("HSET", PREFIX + "x", "tokens", "1"),
    ("HMGET", PREFIX + "x", "tokens"),
    ("PEXPIRE", PREFIX + "x", "1000"),
    ("TIME",),
]
CACHE_OWN = [("MGET", CACHE + "x"), ("PSETEX", CACHE + "x", "1000", "1")]
NEITHER = [
    ("SET", "x", "1"), ("SET", PREFIX + "x", "1"), ("FLUSHALL",), ("CONFIG", "GET", "*"),
    ("KEYS", "*"), ("EVAL", "return 1", "0"), ("ACL", "LIST"), ("SHUTDOWN",),
    ("HGETALL", "other:key"), ("CLIENT", "LIST"), ("SCRIPT", "LOAD", "return 1"),
    ("SCRIPT", "FLUSH"), ("FUNCTION", "LOAD", "#!lua name=x\n"), ("FCALL", "f", "0"),
    # the cache's keys: MGET and PSETEX only, never a write without its expiry
    ("SET", CACHE + "x", "1"), ("SET", CACHE + "x", "1", "PX", "1000"), ("GET", CACHE + "x"),
    ("MGET", CACHE + "x", "other:key"), ("DEL", CACHE + "x"), ("UNLINK", CACHE + "x"),
    ("HSET", CACHE + "x", "f", "1"), ("PEXPIRE", CACHE + "x", "1"), ("PERSIST", CACHE + "x"),
    ("GETDEL", CACHE + "x"), ("KEYS", CACHE + "*"), ("SCAN", "0"), ("FLUSHDB",),
    ("SETEX", CACHE + "x", "1", "1"), ("MSET", CACHE + "x", "1"),
]  # fmt: skip
REFUSED = [
    *((RATE_USER, c) for c in [*CACHE_OWN, *NEITHER]),
    *((CACHE_USER, c) for c in [*RATE_OWN, *NEITHER]),
    (RATE_USER, ("EVAL", _TAKE, "1", CACHE + "x", "1", "3")),  # its script, not on its keys
    (RATE_USER, ("HSET", CACHE + "x", "tokens", "1")),
]


REFUSED_IDS = [f"{user}-{command[0]}-{n}" for n, (user, command) in enumerate(REFUSED)]


@pytest.mark.parametrize(("user", "command"), REFUSED, ids=REFUSED_IDS)
def test_each_user_may_run_its_own_commands_on_its_own_keys_only(
    server: tuple[int, str], user: str, command: tuple
) -> None:
    port, password = server
    client = redis.Redis(port=port, username=user, password=password)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.execute_command(*command)


@pytest.mark.parametrize(("user", "commands"), [(RATE_USER, RATE_OWN), (CACHE_USER, CACHE_OWN)])
def test_each_users_own_commands_run(
    server: tuple[int, str], user: str, commands: list[tuple]
) -> None:
    port, password = server
    client = redis.Redis(port=port, username=user, password=password)
    for command in commands:
        if command[0] == "EVALSHA":  # a fresh Redis has none: EVAL keeps it under its hash
            client.execute_command("EVAL", _TAKE, *command[2:])
        client.execute_command(*command)


# Every command that runs or loads Lua (Redis 7.0): the ACL may name only EVAL of the limiter's
# text and EVALSHA of its hash (never SCRIPT LOAD: a load compiles whatever Lua it is given).
LUA_COMMANDS = {"eval", "eval_ro", "evalsha", "evalsha_ro", "script", "function", "fcall",
                "fcall_ro", "@scripting"}  # fmt: skip


def test_the_acl_runs_the_limiters_script_by_its_text_or_hash_and_no_other_lua() -> None:
    """EVAL of the limiter's script's text and EVALSHA of its SHA-1 only (ACL first-argument
    rules): changing the script (backend/ratelimit.py) means changing both in redis.yaml."""
    args = manifest_args("x", 0, Path("/data"))
    script = [a for a in args if a.lower().lstrip("+-").split("|")[0] in LUA_COMMANDS]
    assert script == [f"+evalsha|{hashlib.sha1(_TAKE.encode()).hexdigest()}", f"+eval|{_TAKE}"]


@pytest.mark.parametrize(
    "script", ["return 1", "return redis.call('HSET', KEYS[1], 'tokens', '1000')"]
)
def test_no_other_script_loads_or_runs(server: tuple[int, str], script: str) -> None:
    """Only the limiter's Lua reaches Redis as the rate limits' user: another script is refused
    before Redis's Lua parser sees it (SCRIPT LOAD compiles; a loop in one would hold Redis, and
    every pod's limits, for seconds)."""
    port, password = server
    client = redis.Redis(port=port, username=RATE_USER, password=password)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.script_load(script)
    sha = hashlib.sha1(script.encode()).hexdigest()
    for command in (("EVALSHA", sha, "1", PREFIX + "x"), ("EVAL", script, "1", PREFIX + "x"),
                    ("EVAL_RO", "return 1", "0"), ("FCALL", "f", "0"),
                    ("FUNCTION", "LOAD", "#!lua name=x\n")):  # fmt: skip
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*command)


@pytest.mark.parametrize(("stored", "most_wait_s"), [(-1000.0, 1.0), (1e12, 0.0)])
def test_the_bucket_is_clamped_at_both_ends(
    server: tuple[int, str], stored: float, most_wait_s: float
) -> None:
    """A bucket whose hash holds a negative or a huge count (written by anything but the script,
    or left by a larger burst) holds 0 to burst tokens: one token's wait at most, burst at most."""
    port, password = server
    client = redis.Redis(port=port, username="gateway", password=password)
    name = f"clamped-{stored}"
    client.hset(PREFIX + _bucket_id(name), mapping={"tokens": str(stored), "ts": str(time.time())})
    store = RedisStore(f"redis://gateway:{password}@127.0.0.1:{port}/0", fallback=None)  # type: ignore[arg-type]
    rate, burst = 1.0, 2.0
    waits = [store.take(name, rate, burst) for _ in range(3)]
    assert waits[0] <= most_wait_s + 0.01, waits
    assert sum(1 for w in waits if w == 0.0) <= burst, waits

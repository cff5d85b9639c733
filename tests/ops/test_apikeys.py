"""ops.apikeys: keys are printed once and stored only as their SHA-256."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.auth import KeyTable, key_hash
from ops import apikeys


def test_add_list_remove_and_the_file_holds_no_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.json"
    assert apikeys.main(["--file", str(path), "add", "team-a", "--models", "m1,m2",
                         "--rate", "5"]) == 0  # fmt: skip
    key = capsys.readouterr().out.strip()
    assert key.startswith("bg-") and len(key) > 40
    assert key not in path.read_text() and key_hash(key) in path.read_text()
    found = KeyTable(str(path)).find(key)
    assert found is not None and found.name == "team-a" and found.allows("m1")
    assert not found.allows("m3") and found.rate == found.burst == 5
    assert apikeys.main(["--file", str(path), "add", "team-a"]) == 1  # names are unique
    assert apikeys.main(["--file", str(path), "list"]) == 0
    assert "team-a\tmodels: m1,m2\t5/s burst 5" in capsys.readouterr().out
    assert apikeys.main(["--file", str(path), "remove", "team-a"]) == 0
    assert KeyTable(str(path)).find(key) is None


def test_a_broken_file_is_a_clear_error_and_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.json"
    path.write_text('{"keys": [{"name": "x", "sha256": "short"}]}')
    assert apikeys.main(["--file", str(path), "add", "y"]) == 1
    assert "64 hex characters" in capsys.readouterr().err
    assert "short" in path.read_text()


def test_a_keys_scope_is_stored_listed_and_read_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.json"
    assert apikeys.main(["--file", str(path), "add", "testers", "--versions", "public,canary,7",
                         "--rate", "0.5"]) == 0  # fmt: skip
    key = capsys.readouterr().out.strip()
    assert apikeys.main(["--file", str(path), "list"]) == 0
    assert "versions: public,canary,7" in capsys.readouterr().out

    found = KeyTable(str(path)).find(key)

    assert found is not None and found.versions == {"public", "canary", 7}
    assert found.burst == 1.0  # a rate under 1/s still lets one request through
    labels, public = {"stable": 2, "canary": 3}, ("stable",)
    assert found.may_name(None, "canary", labels, public) and found.may_name(
        7, None, labels, public
    )
    assert found.may_name(2, None, labels, public) and not found.may_name(3, None, labels, public)


def test_add_refuses_what_the_gateway_would_refuse(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    assert apikeys.main(["--file", str(path), "add", "a", "--versions", ""]) == 0  # default only
    with pytest.raises(ValueError, match="'burst' must be at least 1"):
        apikeys.add(path, "b", None, 5.0, 0.5)
    assert [e["name"] for e in apikeys.load(path)] == ["a"]

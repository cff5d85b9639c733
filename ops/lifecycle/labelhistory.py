"""Each version label's past values, kept beside models.config so a rollback undoes the last move.

``--rollback stable`` must go back to the version ``stable`` named before, not to the newest
older version on disk (that may be a canary that was never promoted). TF Serving's config holds
only the current value, so push_model keeps the history in ``.<config>.labels.json`` beside it:

    {"format": 1, "models": {"minilm": {"stable": [1, 3], "canary": [2]}}}

each list oldest first, its last entry the label's current value. It is written atomically
(temp file, fsync, rename, directory fsync) and only by push_model while it holds the config's
lock, right after the label write it records. A missing file is an empty history (pushes made
before it existed kept none); a file that does not parse is an error naming it, never a crash
and never silently replaced: ``--rollback LABEL --to VERSION`` is the explicit way out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelformat import serverconfig
from ops.modelconfig import OpsError

FORMAT = 1
# A label's history keeps this many values; older ones are dropped (a rollback goes that far).
MAX_ENTRIES = 50

History = dict[str, dict[str, list[int]]]  # model -> label -> values, oldest first


def history_path_for(config_path: Path) -> Path:
    """Return the history file of ``config_path`` (a hidden sibling, like its lock)."""
    return config_path.with_name(f".{config_path.name}.labels.json")


def load(path: Path) -> History:
    """Return the history in ``path`` (empty when there is none); OpsError if it is unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise _unreadable(path, str(exc)) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _unreadable(path, f"not JSON: {exc}") from exc
    return _validated(path, data)


def _validated(path: Path, data: Any) -> History:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _unreadable(path, f'expected {{"format": {FORMAT}, "models": {{...}}}}')
    models = data.get("models")
    if not isinstance(models, dict):
        raise _unreadable(path, '"models" is not an object')
    for model, labels in models.items():
        if not isinstance(labels, dict) or not all(
            isinstance(values, list)
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)
            for values in labels.values()
        ):
            raise _unreadable(path, f"model {model!r}: expected label -> [positive versions]")
    return {m: {label: list(vs) for label, vs in ls.items()} for m, ls in models.items()}


def _unreadable(path: Path, why: str) -> OpsError:
    return OpsError(
        f"label history {path} is unreadable ({why}); fix it or move it away (a missing file "
        "starts a new history), or roll back explicitly with --rollback LABEL --to VERSION"
    )


def record(history: History, model: str, before: dict[str, int], after: dict[str, int]) -> History:
    """Return ``history`` with the label moves from ``before`` to ``after`` appended.

    A label whose history does not end with its value before the move (set before the history
    existed, or by hand) gets that value first, so its previous value is still known.
    """
    new = {m: {label: list(vs) for label, vs in ls.items()} for m, ls in history.items()}
    labels = new.setdefault(model, {})
    for label, version in sorted(after.items()):
        if before.get(label) == version:
            continue
        values = labels.setdefault(label, [])
        if label in before and (not values or values[-1] != before[label]):
            values.append(before[label])
        values.append(version)
        del values[:-MAX_ENTRIES]
    return new


def previous(history: History, model: str, label: str, current: int) -> tuple[int, History]:
    """Return the value ``label`` had before ``current``, and the history with the move undone.

    The history pops: rolling back twice goes two moves back. OpsError when nothing is known.
    """
    values = list(history.get(model, {}).get(label, []))
    if values and values[-1] != current:
        # The label was moved without push_model (by hand): its value before that move is the
        # history's last one.
        target = values[-1]
    elif len(values) >= 2:
        values.pop()
        target = values[-1]
    else:
        raise OpsError(
            f"the label history has no value of {model}'s {label!r} before {current}; roll "
            "back explicitly with --rollback LABEL --to VERSION"
        )
    new = {m: {lb: list(vs) for lb, vs in ls.items()} for m, ls in history.items()}
    new[model][label] = values
    return target, new


def write_atomic(path: Path, history: History) -> None:
    """Replace ``path`` with ``history`` (temp + fsync + rename; the caller holds the lock)."""
    text = json.dumps({"format": FORMAT, "models": history}, indent=1, sort_keys=True) + "\n"
    serverconfig.write_text_atomic(path, text)

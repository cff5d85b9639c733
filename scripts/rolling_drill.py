"""Replicas come and go under load: push, rolling update, a slow replica, a hung one, rollback.

Entry point of ``ops.drills.rolling`` (its code), the same as ``python -m ops.drills rolling``;
``--help`` shows the flags.
"""

from ops.drills.rolling import main

if __name__ == "__main__":
    raise SystemExit(main())

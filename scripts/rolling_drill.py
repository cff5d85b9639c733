"""Replicas come and go under load: push, rolling update, a slow replica, a hung one, rollback.

Entry point of ``ops.rolling_drill`` (its code); ``--help`` shows the flags.
"""

from ops.rolling_drill import main

if __name__ == "__main__":
    raise SystemExit(main())

"""A hostile client (stalled half requests, idle pooled connections, new names and versions, huge
token-id lists) against well-behaved clients at half capacity; rolling restarts under keep-alive
load.

Entry point of ``ops.drills.hostile`` (its code), the same as ``python -m ops.drills hostile``;
``--help`` shows the flags.
"""

from ops.drills.hostile import main

if __name__ == "__main__":
    raise SystemExit(main())

"""Hot reload under load, measured: clients through the gateway while versions are pushed.

Entry point of ``ops.drills.reload`` (its code), the same as ``python -m ops.drills reload``;
``--help`` shows the flags.
"""

from ops.drills.reload import main

if __name__ == "__main__":
    raise SystemExit(main())

"""Several model-server replicas behind one gateway, under load: kill one, push, promote.

Entry point of ``ops.drills.replica`` (its code), the same as ``python -m ops.drills replica``;
``--help`` shows the flags.
"""

from ops.drills.replica import main

if __name__ == "__main__":
    raise SystemExit(main())

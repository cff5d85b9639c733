"""Several model-server replicas behind one gateway, under load: kill one, push, promote.

Entry point of ``ops.replica_drill`` (its code); ``--help`` shows the flags.
"""

from ops.replica_drill import main

if __name__ == "__main__":
    raise SystemExit(main())

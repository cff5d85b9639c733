"""Hot reload under load, measured: clients through the gateway while versions are pushed.

Entry point of ``ops.reload_drill`` (its code); ``--help`` shows the flags.
"""

from ops.reload_drill import main

if __name__ == "__main__":
    raise SystemExit(main())

"""Faults under load, measured: the model server SIGKILLed and restarted, then made slow.

Entry point of ``ops.fault_drill`` (its code); ``--help`` shows the flags.
"""

from ops.fault_drill import main

if __name__ == "__main__":
    raise SystemExit(main())

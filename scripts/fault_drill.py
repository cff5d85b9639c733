"""Faults under load, measured: the model server SIGKILLed and restarted, then made slow.

Entry point of ``ops.drills.fault`` (its code), the same as ``python -m ops.drills fault``;
``--help`` shows the flags.
"""

from ops.drills.fault import main

if __name__ == "__main__":
    raise SystemExit(main())

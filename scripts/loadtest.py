"""Compare gRPC and REST under load, straight at the model server and through the gateway.

Entry point of ``ops.load.protocols`` (its code), the same as ``python -m ops.load protocols``;
``--help`` shows the flags.
"""

from ops.load.protocols import main

if __name__ == "__main__":
    raise SystemExit(main())

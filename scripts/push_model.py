"""Push a model version into serving and move version labels, safely, against a live server.

Entry point of ``ops.lifecycle.push`` (its code), the same as ``python -m ops.lifecycle``;
``--help`` shows the flags.
"""

from ops.lifecycle.push import main

if __name__ == "__main__":
    raise SystemExit(main())

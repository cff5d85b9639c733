"""Start the whole stack locally — model server + gateway — and show a request and its answer.

Entry point of ``ops.demo.stack`` (its code), the same as ``python -m ops.demo run``;
``--help`` shows the flags.
"""

from ops.demo.stack import main

if __name__ == "__main__":
    raise SystemExit(main())

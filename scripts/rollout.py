"""Roll a new model version out on live traffic, step by step; promote it or roll it back.

Entry point of ``ops.rollout.cli`` (its code), the same as ``python -m ops.rollout``;
``--help`` shows the flags.
"""

from ops.rollout.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

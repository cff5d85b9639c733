"""Roll a good version out and a bad one back under 16 clients of real tickets (issue 24's drill).

Entry point of ``ops.drills.rollout`` (its code), the same as ``python -m ops.drills rollout``;
``--help`` shows the flags.
"""

from ops.drills.rollout import main

if __name__ == "__main__":
    raise SystemExit(main())

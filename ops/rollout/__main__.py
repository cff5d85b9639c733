"""``python -m ops.rollout [flags]``: roll a version out on live traffic; promote or roll back."""

from ops.rollout.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

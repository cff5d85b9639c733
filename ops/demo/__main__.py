"""``python -m ops.demo COMMAND [flags]``: the demo models or the local stack."""

import sys

from ops.commands import dispatch

COMMANDS = {
    "models": ("ops.demo.models", "export the demo models (skips the versions that exist)"),
    "run": ("ops.demo.stack", "start model server + gateway locally (--stop: end them)"),
}

if __name__ == "__main__":
    raise SystemExit(dispatch("ops.demo", COMMANDS, sys.argv[1:]))

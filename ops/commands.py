"""A family's command line: ``python -m ops.<family> COMMAND [flags]`` runs one tool's ``main``.

Each family package (``ops.drills``, ``ops.load``, ``ops.demo``) has one entry point, its
``__main__.py``, which names its tools here; a tool's module is imported only when it is the one
asked for, so ``python -m ops.demo run`` does not import the exporter.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping


def dispatch(family: str, commands: Mapping[str, tuple[str, str]], argv: list[str]) -> int:
    """Run ``commands[argv[0]]``'s module's ``main(argv[1:])``; print the commands when asked.

    ``commands`` maps a command to (module, one line saying what it does).
    """
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        width = max(len(name) for name in commands)
        lines = [f"usage: python -m {family} COMMAND [flags]  (COMMAND --help: its flags)", ""]
        lines += [f"  {name:<{width}}  {doc}" for name, (_, doc) in commands.items()]
        known = not argv or argv[0] in ("-h", "--help")
        print("\n".join(lines), file=sys.stdout if known else sys.stderr)
        if not known:
            print(f"\nunknown command {argv[0]!r}", file=sys.stderr)
        return 0 if known else 2
    module, _ = commands[argv[0]]
    main = importlib.import_module(module).main
    sys.argv[0] = f"python -m {family} {argv[0]}"  # argparse's prog: what the user typed
    return int(main(argv[1:]))

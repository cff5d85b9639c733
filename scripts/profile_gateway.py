"""Profile the gateway under load: where its workers' CPU goes, function by function (py-spy).

Entry point of ``ops.load.profiler`` (its code), the same as ``python -m ops.load profile``;
``--help`` shows the flags.
"""

from ops.load.profiler import main

if __name__ == "__main__":
    raise SystemExit(main())

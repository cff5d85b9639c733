"""Profile the gateway under load: where its workers' CPU goes, function by function (py-spy).

Entry point of ``ops.load.profiler`` (its code); ``--help`` shows the flags.
"""

from ops.load.profiler import main

if __name__ == "__main__":
    raise SystemExit(main())

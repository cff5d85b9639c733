"""An embedder migrated to another vector space under load: queries by label, the label moved once.

Entry point of ``ops.drills.migration`` (its code), the same as ``python -m ops.drills
migration``; ``--help`` shows the flags.
"""

from ops.drills.migration import main

if __name__ == "__main__":
    raise SystemExit(main())

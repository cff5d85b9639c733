"""``python -m finetune``: see finetune/cli.py."""

from finetune.cli import main

raise SystemExit(main())

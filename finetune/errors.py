"""The one exception type every user-facing fine-tuning failure raises."""

from __future__ import annotations

from modelformat.errors import FormatError


class FinetuneError(FormatError):
    """A fine-tuning run that cannot go ahead; the message names the file, row or setting at fault.

    The CLI prints the message on one line and exits with status 2; nothing is written to ``--out``.
    """

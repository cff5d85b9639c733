"""The one exception type every user-facing export failure raises."""

from __future__ import annotations

from modelformat.errors import FormatError


class ExportError(FormatError):
    """An export that cannot go ahead; the message names the file, tensor or setting at fault.

    The CLI prints the message and exits with status 1; nothing is published when it is raised.
    """

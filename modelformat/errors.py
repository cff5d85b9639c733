"""The exception the model-format helpers raise."""

from __future__ import annotations


class FormatError(ValueError):
    """A version directory or config that breaks the format; the message names the path at fault.

    ``export.errors.ExportError`` derives from it, so the export CLI and the ops scripts catch
    one type for every failure to read or publish a version.
    """

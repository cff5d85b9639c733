"""Tests that start a program from a Debian package (requirements-debian.txt).

As root, `make sysdeps` (run by `make test`) installs them, so a missing one fails the test. A user
who is not root may lack the package: those tests skip, saying which package to install.
"""

from __future__ import annotations

import os
import shutil

import pytest


def needs(program: str, package: str) -> pytest.MarkDecorator:
    """Skip when ``program`` is missing and this user could not have installed it (not root)."""
    missing = shutil.which(program) is None and os.geteuid() != 0
    return pytest.mark.skipif(  # a Debian package a user who is not root may lack
        missing, reason=f"needs Debian package {package}: not root, make sysdeps can't add it"
    )

"""The gateway's wire-compatible subset of TF Serving's messages (compiled by `build.py`)."""

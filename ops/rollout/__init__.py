"""Rolling a version out on live traffic, step by step: promoted or rolled back on its figures.

``engine`` drives one model's rollout; ``state`` keeps the routing entry and the state beside it
consistent (resume, ``--revert``); ``steps`` holds and meters each step, ``decisions`` decides it
from ``metrics`` (the gateway's or Prometheus' figures); ``push`` publishes the version and moves
the label through ``ops.lifecycle``; ``cli`` is the command line. One entry point:
``python -m ops.rollout [flags]`` (``__main__``); ``scripts/rollout.py`` runs the same ``main``.
"""

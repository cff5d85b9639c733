"""The drills: the stack under load while something goes wrong, measured and checked.

Each drill starts a throw-away stack (``ops.stack``) on a copy of the models, runs clients that
record every answer (``common``), causes its faults and prints its checks and timeline:
``reload`` (versions pushed under load), ``fault`` (the model server killed, then slow),
``replica`` (a replica killed, a push, a promotion), ``rolling`` (replicas come and go),
``rollout`` (a good version rolled out and a bad one back, on real tickets: ``tickets``,
``rolloutreport``) and ``hostile`` (hostile clients beside well-behaved ones).
One entry point: ``python -m ops.drills DRILL [flags]`` (``__main__``); ``scripts/*_drill.py`` run
the same ``main``.
"""

"""Operating the stack: one floor of shared pieces, one package per family of tools.

The floor (imports no family): ``procs`` (processes on free ports), ``modelconfig`` (models.config
planning, ``OpsError``), ``server`` (the model server's ModelService), ``stack`` (throw-away
stacks), ``delayproxy`` (a slow upstream over real sockets), ``commands`` (a family's command line)
and two single-module tools that deployments run by module name: ``apikeys`` and ``tfs_ready``.

The families, each with one entry point ``python -m ops.<family>`` (its ``__main__``):
``demo`` (demo models, the local stack), ``lifecycle`` (push, add a model, labels),
``rollout`` (steps, decisions, promotion), ``load`` (load tests, the gateway's profile) and
``drills``. A family imports the floor and only the families below it
(tests/test_layout.py: ``FAMILIES``); ``scripts/`` holds the thin entry points people use.
"""

"""The demo a new user runs: its models and the local stack that serves them (``make run``).

``models`` exports the demo models from the real all-MiniLM-L6-v2 weights (``make models``);
``stack`` starts the model server and the gateway in the background on this checkout's models,
shows a request and its answer, and keeps the running stack's ports in ``.stack/`` (the push tool
finds its default server there). One entry point: ``python -m ops.demo {models,run} [flags]``
(``__main__``); ``scripts/demo_models.py`` and ``scripts/run_stack.py`` run the same ``main``.
"""

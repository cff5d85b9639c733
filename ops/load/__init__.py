"""Load on the stack, measured: generators, the gRPC-vs-REST grid, the gateway's profile.

``cells`` makes the requests a user's client would send (gRPC, REST, the gateway) and runs one
closed-loop cell; ``protocols`` runs the grid (targets x protocols x concurrency x sizes) and
``report`` writes its CSV, markdown and plots; ``profiler`` samples the gateway's workers with
py-spy under that load. One entry point: ``python -m ops.load {protocols,profile} [flags]``
(``__main__``); ``scripts/loadtest.py`` and ``scripts/profile_gateway.py`` run the same ``main``.
"""

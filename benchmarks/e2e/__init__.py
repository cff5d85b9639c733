"""The headline: what a client gets end to end from early exits, beside a direct gRPC client.

One run, one stack as production runs it: ``python -m modelserver`` (``TFS_BIN`` for the real
binary) with serving_config's batching file, gunicorn with docker/gunicorn.conf.py (grpc upstream,
its default workers and threads, access log on). Models, made in this run (or reused, below):

- ``tickets`` v1: MiniLM-L6 fine-tuned on data/tickets (2 epochs, ``early_exit_bench``'s code),
  exported without exits — the full model;
- ``tickets`` v2: the same checkpoint with its distilled students, exported ``--early-exit``;
- ``minilm`` (the demo embedder under ``--base-path``) for the row beside infinity;
- ``tiny-floor``: a random 2-layer, 32-wide BERT, for the model server's per-call cost.

The checkpoint comes from ``$E2E_CHECKPOINT`` or ``run/finetune-demo/tickets-v1-exits`` when
one is there (``make finetune-demo`` leaves it), else it is trained here (a few minutes).
``--quick`` uses a random 3-layer checkpoint with students instead (accuracy then means nothing).

Load: 16 closed-loop clients, one ticket per request, the 200 tickets of data/tickets/test.tsv
cycled (each client from its own offset). Cells of equal length, interleaved (the order rotated
each repeat), medians over repeats:

- direct: a gRPC stub per client that tokenizes the ticket itself (the version's vocabulary),
  pads it to its bucket and calls v1's ``seq_<L>`` signature — what the gateway sends, no gateway;
- gateway at speed 0 / 0.7 / 0.8 of v2 (``:classify`` with ``version`` and ``speed``);
- ``:embed`` on minilm through the gateway vs infinity's ``/embeddings`` on the same weights.

CPU per request: utime+stime of the gunicorn master + workers, of the model server (all threads),
of infinity, and the load generator's own process time, over each cell's measured window.
The breakdown (``results/e2e_breakdown.md`` and its plot) adds: rows per model call from the model
server's ``processed_batch_size`` histogram, the exported graph in process at batch 1/8/32 (exit
machinery at speed 0 vs the non-exit export), the model server's per-call cost on ``tiny-floor``
and the gateway's CPU per sequential request.

The package by concern, lower first (tests/test_layout.py: ``E2E_LAYERS``): ``plan`` (the cells,
names and paths), ``models`` (the models made), ``senders`` (what the clients send), ``cells``
(the load cells and their CPU), ``accuracy``, ``floor`` (the fixed costs), ``peers`` (infinity),
``stacks`` (the servers started), ``report`` (rows, page, plot) and ``headline`` (``run``, which
``scripts/bench.py --only e2e`` calls).
"""

from benchmarks.e2e.headline import run

__all__ = ["run"]

"""Batch jobs: re-embed a corpus with the gateway's own stages, straight to the model server.

``inputs`` reads the job's input (the OpenAI Batch format, or JSONL / Parquet rows of an id and
a text) into items and bad rows, checked by the gateway's own validation; either form is written
as Parquet (id, the output kinds asked, model, version) or as OpenAI Batch output and error
files (``answers``); ``parts`` writes part files and the manifest, each renamed into place
whole, so a killed job resumes with nothing lost and nothing twice; ``pacing`` yields to online
traffic (a probe before each call; AIMD and a rate cap as options);
``progress`` shows rows/s and the time left; ``job`` plans the parts (sorted by length) and runs
them through ``backend.service.Gateway.embeddings`` (``Gateway.embed`` for sparse and
multi-vector outputs). One entry point: ``python -m ops.batch``
(``__main__``); ``scripts/batch.py`` runs the same ``main``.
"""

"""A model's life in serving: push a version, add a model, move and roll back labels.

``push`` is the tool (against a live server, under the config's lock, on every replica, with a
dry run); ``addmodel`` plans a model that is not in the serving config yet; ``labelhistory``
keeps each label's past values beside models.config for ``--rollback``. One entry point:
``python -m ops.lifecycle [flags]`` (``__main__``); ``scripts/push_model.py`` runs the same
``main``.
"""

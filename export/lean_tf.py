"""Import TensorFlow without the Keras it loads for nobody: the model server's and export's start.

TensorFlow's ``__init__`` imports ``keras.src.optimizers`` eagerly (so that Keras optimizers
register in the SavedModel registry), which imports most of Keras: about 1.5 s of CPU at every
start, two fifths of the import. The model server and the exporter never touch Keras (their
graphs are ``tf.Module``/``tf.function``, their SavedModels hold no optimizer). TensorFlow
wraps that import in ``try/except ImportError``, so entering the module as absent for the length
of the import skips it, and removing the entry afterwards leaves ``import keras`` working as
before for any code of the process that wants it (``tf.keras`` stays TensorFlow's lazy loader).
Fine-tuning imports TensorFlow the plain way: it is Keras.
"""

from __future__ import annotations

import sys
from types import ModuleType

EAGER_KERAS = "keras.src.optimizers"


def import_tensorflow() -> ModuleType:
    """Return the ``tensorflow`` module, imported without the eager Keras optimizers import when
    this process has imported neither yet (otherwise the module as it is)."""
    if "tensorflow" in sys.modules or "keras" in sys.modules:
        import tensorflow

        return tensorflow
    sys.modules[EAGER_KERAS] = None  # type: ignore[assignment]  # import of it: ImportError
    try:
        import tensorflow
    finally:
        if sys.modules.get(EAGER_KERAS, ...) is None:
            del sys.modules[EAGER_KERAS]
    return tensorflow

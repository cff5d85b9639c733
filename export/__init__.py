"""Export fine-tuned BERT checkpoints as versioned SavedModels for TF Serving.

Importing this package is cheap: TensorFlow is imported only by the modules that need it
(``export.model``, ``export.predictor`` ...), so ``export.hardware`` and ``export.tiny`` are
usable from TF-free processes. The on-disk format itself lives in ``modelformat``.
"""

__version__ = "0.1.0"

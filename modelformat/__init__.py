"""The model format shared by every part: version directories, publishing, buckets, model.json,
names, ``models.config`` and GetModelStatus states (docs/architecture.md, contract 1).
No TensorFlow."""

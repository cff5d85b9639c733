"""The model format shared by every part: version directories, publishing, buckets, model.json,
names, ``models.config`` and GetModelStatus states (DESIGN.md contract 1). No TensorFlow."""

"""Fine-tune a BERT checkpoint on labelled texts; write a Hugging Face checkpoint export reads."""

from __future__ import annotations

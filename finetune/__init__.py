"""Fine-tune a BERT-family checkpoint on labelled texts; write an HF checkpoint export reads."""

from __future__ import annotations

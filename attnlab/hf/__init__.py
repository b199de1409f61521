"""Hugging Face checkpoints in and out (``attnlab import-hf`` / ``export-hf``): the families
attnlab represents exactly (families/, one module a family), the directory format (files.py),
the conversion (convert.py)."""

"""Hugging Face checkpoints in and out (``attnlab import-hf`` / ``export-hf``): the families
attnlab represents exactly (families.py), the directory format (files.py), the conversion
(convert.py)."""

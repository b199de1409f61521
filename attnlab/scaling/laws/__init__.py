"""The scaling laws, one file each, and their registry (``registry.LAWS``)."""

"""HF's own common model tests, vendored from the transformers sdist (see README.md)."""

"""HF's own common model tests, vendored from the transformers sdists, one folder a release (see README.md)."""

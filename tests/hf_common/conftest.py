# The vendored files are libraries for tests/test_hf_common.py, not test modules of their own.
collect_ignore_glob = ["*.py", "*/*.py"]

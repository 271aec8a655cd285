#!/usr/bin/env python
"""`hf-headattn parse`, run from a clone (``--help`` lists its flags). Its code, examples and what it writes:
hf_headattn/experiment/parse_sources.py."""

from hf_headattn.experiment.parse_sources import main

if __name__ == "__main__":
    main()

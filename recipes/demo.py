#!/usr/bin/env python
"""`hf-headattn demo`, run from a clone (``--help`` lists its flags). Its code, examples and what it writes:
hf_headattn/experiment/demo.py."""

from hf_headattn.experiment.demo import main

if __name__ == "__main__":
    main()

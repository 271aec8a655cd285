#!/usr/bin/env python
"""`hf-headattn average`, run from a clone (``--help`` lists its flags). Its code, examples and what it writes:
hf_headattn/experiment/average_checkpoints.py."""

from hf_headattn.experiment.average_checkpoints import main

if __name__ == "__main__":
    main()

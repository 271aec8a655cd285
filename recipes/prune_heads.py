#!/usr/bin/env python
"""`hf-headattn prune`, run from a clone (``--help`` lists its flags). Its code, examples and what it writes:
hf_headattn/experiment/prune_heads.py."""

from hf_headattn.experiment.prune_heads import main

if __name__ == "__main__":
    main()

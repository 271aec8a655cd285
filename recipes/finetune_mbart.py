#!/usr/bin/env python
"""`hf-headattn finetune`, run from a clone (``--help`` lists its flags). Its code, examples and what it writes:
hf_headattn/experiment/finetune_mbart.py."""

from hf_headattn.experiment.finetune_mbart import main

if __name__ == "__main__":
    main()

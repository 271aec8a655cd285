#!/usr/bin/env python
"""`hf-headattn translate`, run from a clone (``--help`` lists its flags). Its code, examples and what it writes:
hf_headattn/experiment/translate_lines.py."""

from hf_headattn.experiment.translate_lines import main

if __name__ == "__main__":
    main()

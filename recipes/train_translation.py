#!/usr/bin/env python
"""`hf-headattn train`, run from a clone (``--help`` lists its flags). Its code, examples and what it writes:
hf_headattn/experiment/translation_recipe.py."""

from hf_headattn.experiment.translation_recipe import main

if __name__ == "__main__":
    main()

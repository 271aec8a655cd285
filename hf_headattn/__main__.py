"""`python -m hf_headattn <command> ...`: the `hf-headattn` command ([`hf_headattn.cli`][hf_headattn.cli]), where the
console script is not on the `PATH` or a launcher takes a module (`torchrun -m hf_headattn train ...`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m hf_headattn"))

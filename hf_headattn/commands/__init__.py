"""The `hf-headattn` commands, one module each ([`hf_headattn.cli.COMMANDS`][hf_headattn.cli.COMMANDS]): `train`,
`finetune`, `translate`, `prune`, `average`, `parse` and `demo`. Each module's `main(argv, prog)` runs its command, over
the library of `hf_headattn.experiment`; the one entry point is the CLI (`hf-headattn <command>`, or
`python -m hf_headattn <command>`), which imports a command's module only when it runs."""

"""`hf-headattn parse`: parse the source side of a parallel corpus once, into CoNLL-U files that `hf-headattn train`
reads.

SEA/RHE need dependency parses of the sources. Parsing needs spaCy; training may run where spaCy is not installed
(a GPU box, a cluster image). Parse here with the same data flags as the training run, then train there with
`--syntax_parses_dir`:

    hf-headattn parse --source_lang en --target_lang de \\
        --output_dir parses/multi30k_en
    hf-headattn train --method lpea_rhe \\
        --syntax_parses_dir parses/multi30k_en ...

Writes `<output_dir>/<split>.<source_lang>.conllu` per split (sentence `k` parses example `k`); a line that
spaCy would split into several sentences is parsed as one, as in training. `parser.json` names the spaCy pipeline;
the training run records it in the model's config (`syntax_parser`), so the model translates raw text with it.
The folder is written whole (into a hidden sibling first, renamed when complete, so an interrupted run leaves
nothing); an `--output_dir` that holds anything is refused unless `--overwrite`, which replaces it, and one that is
(or holds) the data it parses is refused always.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from hf_headattn.cli import refuse_python_m
from hf_headattn.experiment.arguments import RecipeArgumentParser
from hf_headattn.experiment.multi30k import Multi30kError
from hf_headattn.experiment.outputs import DATA_FLAGS, check_output_dir, flag_inputs, replacing_dir
from hf_headattn.experiment.recipe_parts import ParallelDataArguments, found_data, read_data, write_json
from hf_headattn.syntax_inputs import (
    DEFAULT_SPACY_MODEL,
    Dependencies,
    MissingParserError,
    SpacyParser,
    parse_corpus,
    write_conllu,
)
from hf_headattn.syntax_inputs.provider import PARSER_FILE, parses_file_name, syntax_parser_name


@dataclass
class ParseArguments:
    output_dir: str = field(metadata={"help": "Folder for the <split>.<source_lang>.conllu files"})
    spacy_model: str = field(default=DEFAULT_SPACY_MODEL, metadata={"help": "spaCy pipeline with a parser"})
    num_proc: int | None = field(default=None, metadata={"help": "Parsing processes"})
    overwrite: bool = field(default=False, metadata={"help": "Replace an --output_dir that holds files"})


def main(argv=None, prog: str | None = None) -> dict[str, str]:
    """Parse the sources that `argv` (default `sys.argv[1:]`) names: `{split: CoNLL-U file}`. `prog`: the name
    its usage and errors give (default the script's, argparse's)."""
    parser = RecipeArgumentParser((ParallelDataArguments, ParseArguments), prog=prog, description=__doc__)
    data_args, parse_args = parser.parse_args_into_dataclasses(args=argv)
    if parse_args.num_proc is not None and parse_args.num_proc < 1:
        parser.error(f"--num_proc must be a positive integer, got {parse_args.num_proc}")
    try:
        inputs = flag_inputs(data_args, DATA_FLAGS) | found_data(data_args)  # never into the data, however found
        check_output_dir(parse_args.output_dir, inputs, overwrite=parse_args.overwrite)
        spacy = SpacyParser(parse_args.spacy_model, on_multiple_sentences="join")
        spacy.nlp  # loaded now: a missing spaCy or pipeline is named before the data is read
    except (ValueError, Multi30kError, MissingParserError) as error:
        parser.error(str(error))
    raw = read_data(parser, data_args)
    src = data_args.source_lang
    written = {}
    with replacing_dir(parse_args.output_dir) as folder:
        for split, dataset in raw.items():
            parsed = parse_corpus(dataset, src, dependencies=spacy, num_proc=parse_args.num_proc)
            parses = [Dependencies(*row) for row in zip(parsed["syntax_dep_starts"], parsed["syntax_dep_ends"],
                                                          parsed["syntax_dep_heads"])]
            texts = [pair[src] for pair in dataset["translation"]]
            write_conllu(folder / parses_file_name(split, src), texts, parses)
            written[split] = str(Path(parse_args.output_dir) / parses_file_name(split, src))
            print(f"{split}: {len(parses)} parses -> {written[split]}", file=sys.stderr)
        # the training run (hf-headattn train) records this in the model's config, for hf_headattn.translate
        write_json(folder / PARSER_FILE, {"syntax_parser": syntax_parser_name(parse_args.spacy_model)})
    return written


if __name__ == "__main__":  # `python -m` of this module: a usage error naming the command to run
    refuse_python_m(__spec__.name)

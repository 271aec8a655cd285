"""hf-headattn finetune end to end: a tiny locally saved mBART (with an mBART tokenizer
trained here) fine-tuned with EaDRA for two steps on 32 Multi30k lines, then scored with sacreBLEU."""

import io
import json
import re

import pytest
import sentencepiece as spm
import torch
from transformers import MBartConfig, MBartForConditionalGeneration, MBartTokenizer
from transformers.models.mbart.tokenization_mbart import FAIRSEQ_LANGUAGE_CODES

from hf_headattn import HeadAttnMBartForConditionalGeneration
from hf_headattn.commands import finetune


def mbart_tokenizer(sentences) -> MBartTokenizer:
    """An mBART (cc25-style) tokenizer over a unigram vocabulary learned from ``sentences``."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model, vocab_size=200,
                                   hard_vocab_limit=False, character_coverage=1.0, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())
              if not (sp.is_control(i) or sp.is_unknown(i))]
    specials = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    return MBartTokenizer(vocab=specials + pieces + [(code, 0.0) for code in FAIRSEQ_LANGUAGE_CODES]
                          + [("<mask>", 0.0)])


@pytest.fixture(scope="module")
def tiny_mbart(tmp_path_factory, multi30k_lines):
    lines = {lang: [line.strip() for line in multi30k_lines("train", lang, 32)] for lang in ("en", "de")}
    tokenizer = mbart_tokenizer(lines["en"] + lines["de"])
    torch.manual_seed(0)
    config = MBartConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=0,
        decoder_start_token_id=tokenizer.eos_token_id, forced_eos_token_id=tokenizer.eos_token_id,
    )
    path = tmp_path_factory.mktemp("tiny-mbart")
    MBartForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
def test_finetunes_with_eadra_and_scores_with_sacrebleu(tiny_mbart, tmp_path):
    out = tmp_path / "run"
    results = finetune.main([
        "--model_name_or_path", str(tiny_mbart), "--output_dir", str(out),
        "--eadra", '{"encoder": {"num_heads": 2}, "decoder": {"num_heads": 1, "layers": [-1]}}',
        "--max_train_samples", "32", "--max_eval_samples", "8", "--max_predict_samples", "8",
        "--max_source_length", "48", "--max_target_length", "48", "--generation_max_length", "12",
        "--num_beams", "2", "--max_steps", "2", "--per_device_train_batch_size", "16", "--learning_rate", "1e-3",
        "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none", "--use_cpu", "--seed", "0",
        "--entropy_report", "--disable_tqdm", "true",
    ])
    saved = json.loads((out / "results.json").read_text())
    assert set(saved["scores"]) == {"validation", "test_2016_flickr"}
    for scores in saved["scores"].values():
        assert 0 <= scores["bleu"] <= 100 and scores["bleu_signature"].startswith("nrefs:1")
    assert len((out / "predictions_test_2016_flickr.txt").read_text().splitlines()) == 8
    logged = [entry for entry in saved["log_history"] if "loss" in entry]
    assert len(logged) == 2
    for entry in logged:  # the EaDRA terms are logged beside the loss, and weigh in
        assert entry["eadra_loss"] != 0 and entry["eadra_terms/encoder/sent"] < 0
        assert entry["eadra_terms/decoder/dist"] > 0 and "eadra_terms/cross/sent" not in entry
    for name in ("before", "after"):
        assert (out / f"encoder_entropy_{name}.png").is_file()
        report = json.loads((out / f"encoder_entropy_{name}.json").read_text())
        assert 0 <= report["min"] <= report["avg"] <= report["max"] <= 1 and report["num_sentences"] == 8
    assert results["entropy"]["before"] != results["entropy"]["after"]  # two steps at lr 1e-3 move the attention
    model = HeadAttnMBartForConditionalGeneration.from_pretrained(out)
    assert model.config.eadra["decoder"] == {"num_heads": 1, "layers": [-1]}
    assert model.config.decoder_start_token_id == model.generation_config.decoder_start_token_id != 2


def test_unknown_language_code_is_a_clear_error(tiny_mbart):
    tokenizer = MBartTokenizer.from_pretrained(tiny_mbart)
    model = HeadAttnMBartForConditionalGeneration.from_pretrained(tiny_mbart)
    with pytest.raises(ValueError, match="language code 'english' is not in the tokenizer's vocabulary"):
        finetune.set_languages(tokenizer, model, "english", "de_DE")


@pytest.mark.parametrize("flags, message", [
    (["--eadra", '{"encoder": {"layers": [7]}}'], r"eadra\['encoder'\]\['layers'\] contains 7"),
    (["--eadra", '{"encoder": {"num_heads": 2, "typo": 1}}'], r"typo"),
    (["--source_lang_code", "english"], r"language code 'english' is not in the tokenizer's vocabulary"),
])
def test_bad_settings_are_usage_errors_before_anything_is_written(tiny_mbart, tmp_path, flags, message, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        finetune.main(["--model_name_or_path", str(tiny_mbart), "--output_dir", str(out), "--report_to", "none",
                             "--max_train_samples", "8", "--max_eval_samples", "4", "--max_predict_samples", "4",
                             *flags])
    error = capsys.readouterr().err
    assert stop.value.code == 2 and re.search(message, error) and "Traceback" not in error, error
    assert not out.exists()

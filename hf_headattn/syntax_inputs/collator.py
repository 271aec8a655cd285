"""Collator that adds the SEA syntax tensors to a seq2seq batch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DataCollatorForSeq2Seq
from transformers.utils import PaddingStrategy

from hf_headattn.phrase_values import DEFAULT_RULE2, RULE2
from hf_headattn.registry import registered_methods
from hf_headattn.settings_checks import check_choice

from .dataset import SPECIAL_TOKEN_VALUES, TOKEN_COLUMNS
from .features import token_dependency_mask, token_phrase_positions


@dataclass
class DataCollatorForSyntaxSeq2Seq(DataCollatorForSeq2Seq):
    """`DataCollatorForSeq2Seq` that also returns `dependency_mask` and `phrase_positions`.

    Identical to the parent except: the per-token `syntax_*` columns of
    [`align_syntax`][hf_headattn.syntax_inputs.dataset.align_syntax] are taken out of every feature before the parent
    pads the rest, and turned into

    * `dependency_mask` (batch, src_len, src_len) bool: Eq. 5, True where attention is allowed (head-dependent
      pair in either direction, subwords of one word, or i = j); special tokens and padding relate only to
      themselves, so no row is all False;
    * `phrase_positions` (batch, src_len, src_len) long: RP of Figure 3 (layer difference inside the local phrase,
      Rules 1-2), `NOT_IN_PHRASE` outside it and everywhere on padding rows and columns; special tokens get 0 on
      their diagonal only. The model clips to +-k.

    `src_len` is the padded `input_ids` length (`padding`, `max_length`, `pad_to_multiple_of` and the
    tokenizer's `padding_side` apply). Built with batched numpy ops, no per-token Python. The returned batch
    holds what the parent returns (`input_ids`, `attention_mask`, `labels`, `decoder_input_ids` given a
    `model`) plus these two tensors. Needs `padding` enabled. `rule2`: "symmetric" (default) or "literal", the
    reading of the paper's Rule 2 ([`local_phrases`][hf_headattn.syntax_inputs.features.local_phrases]); take it from
    the model's `config.sea["rule2"]` so that inference reads the phrases as training did
    ([`for_model`][hf_headattn.syntax_inputs.collator.DataCollatorForSyntaxSeq2Seq.for_model] does).
    """

    rule2: str = DEFAULT_RULE2

    @classmethod
    def for_model(cls, tokenizer, model, settings: Mapping | None = None, **kwargs) -> DataCollatorForSyntaxSeq2Seq:
        """The collator of `model`, reading Rule 2 as its config's settings of the method that reads
        `phrase_positions` say (SEA's `config.sea`; else as `settings` do, config fields such as a recipe's; else
        the default reading), so that inference reads the phrases as training did."""
        config = getattr(model, "config", None)
        for spec in registered_methods():
            values = getattr(config, spec.name, None) or (settings or {}).get(spec.name)
            if "phrase_positions" in spec.inputs and values:
                return cls(tokenizer, model=model, rule2=values.get("rule2", cls.rule2), **kwargs)
        return cls(tokenizer, model=model, **kwargs)

    def __call__(self, features, return_tensors=None):
        return_tensors = return_tensors or self.return_tensors
        if return_tensors not in ("pt", "np"):
            raise ValueError(f"return_tensors must be 'pt' or 'np', got {return_tensors!r}")
        check_choice(self.rule2, "rule2", RULE2)
        if self.padding is False or self.padding == PaddingStrategy.DO_NOT_PAD:
            raise ValueError(f"{type(self).__name__} needs padded input_ids; got padding={self.padding!r}")
        check_token_columns(features)
        plain = [{k: v for k, v in f.items() if not k.startswith("syntax_")} for f in features]
        batch = super().__call__(plain, return_tensors=return_tensors)
        tensors = syntax_tensors(features, batch["input_ids"].shape[1], self.tokenizer.padding_side, self.rule2)
        if return_tensors == "pt":
            tensors = {name: torch.from_numpy(value) for name, value in tensors.items()}
        batch.update(tensors)
        return batch


def check_token_columns(features) -> None:
    """Raise `ValueError` naming the feature and column unless every feature holds each of
    [`TOKEN_COLUMNS`][hf_headattn.syntax_inputs.dataset.TOKEN_COLUMNS], one value per `input_ids` token."""
    for b, f in enumerate(features):
        for c in TOKEN_COLUMNS:
            if c not in f or len(f[c]) != len(f["input_ids"]):
                got = f"{len(f[c])} values" if c in f else "no such column"
                raise ValueError(f"feature {b} of the batch: {c} has {got}, expected one per input_ids token "
                                 f"({len(f['input_ids'])}); build the dataset with align_syntax and the same tokenizer "
                                 "(and give the Trainer remove_unused_columns=False)")


def syntax_tensors(features, src_len: int, padding_side: str, rule2: str,
                   phrases: bool = True) -> dict[str, np.ndarray]:
    """`dependency_mask` (batch, src_len, src_len) bool and (`phrases`) `phrase_positions` (batch, src_len,
    src_len) int64 of a batch whose `input_ids` are padded to `src_len` on `padding_side`, from its features'
    [`TOKEN_COLUMNS`][hf_headattn.syntax_inputs.dataset.TOKEN_COLUMNS] (see
    [`DataCollatorForSyntaxSeq2Seq`][hf_headattn.syntax_inputs.collator.DataCollatorForSyntaxSeq2Seq]). Batched numpy
    ops, no per-token Python."""
    lengths = np.array([len(f["input_ids"]) for f in features])
    positions = np.arange(src_len)
    if padding_side == "left":
        present = positions >= src_len - lengths[:, None]  # (B, T)
    else:
        present = positions < lengths[:, None]
    token = {}
    for c in TOKEN_COLUMNS:
        values = np.full(present.shape, SPECIAL_TOKEN_VALUES[c], dtype=np.int64)  # (B, T)
        values[present] = np.concatenate([np.asarray(f[c], dtype=np.int64) for f in features])
        token[c] = values
    dependency_mask = token_dependency_mask(token["syntax_word"], token["syntax_head"])
    if not phrases:
        return {"dependency_mask": dependency_mask}
    phrase_positions = token_phrase_positions(
        token["syntax_phrase_layer"], token["syntax_phrase_rank"], token["syntax_phrase_start"],
        token["syntax_phrase_end"], present, rule2)
    return {"dependency_mask": dependency_mask, "phrase_positions": phrase_positions}

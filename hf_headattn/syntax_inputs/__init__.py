"""The shared syntax input provider: the parses and the inputs made from them (Zhang et al., "Enlivening Redundant
Heads in Multi-head Self-attention", §4.1, §5.1) for every method that reads them: SEA's `dependency_mask` and
`phrase_positions`, RHE's `dependency_mask` for Rel_Pos+RHE, Localness+RHE and a plug-in alike. Outside every
method folder, so that no method imports another's; `provider` holds the kit hooks (recipe flags, the parser,
features, collation, inference).

Pipeline: [`parse_corpus`][hf_headattn.syntax_inputs.dataset.parse_corpus] (spaCy / CoNLL-U dependencies; benepar /
bracketed-tree / dependency-derived phrases) -> [`align_syntax`][hf_headattn.syntax_inputs.dataset.align_syntax] (words
to subword tokens) -> [`DataCollatorForSyntaxSeq2Seq`][hf_headattn.syntax_inputs.collator.DataCollatorForSyntaxSeq2Seq]
(the `dependency_mask` and `phrase_positions` batch tensors). The math lives in `features` as pure functions.
"""

from .alignment import sentencepiece_spans, token_char_spans, token_words
from .collator import DataCollatorForSyntaxSeq2Seq
from .dataset import (
    DEPENDENCY_PHRASES,
    SPECIAL_TOKEN_VALUES,
    TOKEN_COLUMNS,
    WORD_COLUMNS,
    add_syntax_features,
    align_syntax,
    normalize_source,
    parse_corpus,
)
from .features import (
    NOT_IN_PHRASE,
    dependency_mask,
    local_phrases,
    phrase_tree_features,
    relative_phrasal_positions,
    token_dependency_mask,
    token_phrase_positions,
)
from .parsing import (
    DEFAULT_SPACY_MODEL,
    BeneparParser,
    Dependencies,
    MissingParserError,
    PhraseTree,
    SpacyParser,
    SyntaxInputError,
    dependency_phrase_tree,
    load_benepar,
    load_spacy,
    match_words,
    parse_bracketed,
)
from .readers import BracketedTreeFile, ConlluFile, read_conllu, write_conllu

__all__ = [
    "NOT_IN_PHRASE", "DEFAULT_SPACY_MODEL", "DEPENDENCY_PHRASES", "SPECIAL_TOKEN_VALUES", "TOKEN_COLUMNS",
    "WORD_COLUMNS",
    "dependency_mask", "local_phrases", "relative_phrasal_positions", "phrase_tree_features",
    "token_dependency_mask", "token_phrase_positions",
    "Dependencies", "PhraseTree", "SpacyParser", "BeneparParser", "ConlluFile", "BracketedTreeFile",
    "dependency_phrase_tree", "parse_bracketed", "read_conllu", "write_conllu", "load_spacy", "load_benepar",
    "match_words",
    "SyntaxInputError", "MissingParserError",
    "sentencepiece_spans", "token_char_spans", "token_words",
    "parse_corpus", "align_syntax", "add_syntax_features", "normalize_source", "DataCollatorForSyntaxSeq2Seq",
]

"""SEA syntax features as pure functions (Zhang et al., "Enlivening Redundant Heads", §4.1).

* [`dependency_mask`][hf_headattn.syntax_inputs.features.dependency_mask] -- the dependency mask of Eq. 5 (True where
`D_ij = 0`).
* [`local_phrases`][hf_headattn.syntax_inputs.features.local_phrases] -- the local phrase of every word, Rules 1-2.
* [`relative_phrasal_positions`][hf_headattn.syntax_inputs.features.relative_phrasal_positions] -- the relative phrasal
position matrix RP of Figure 3.
* [`phrase_tree_features`][hf_headattn.syntax_inputs.features.phrase_tree_features] -- four integers per word that
encode Rules 1-2 and RP compactly.
* [`token_dependency_mask`][hf_headattn.syntax_inputs.features.token_dependency_mask],
[`token_phrase_positions`][hf_headattn.syntax_inputs.features.token_phrase_positions] -- batched (numpy) builders of the
token-level
  tensors from those per-token integers; the collator calls them.

The word-level functions are one-sentence numpy references written straight from the rules; the batched builders
use a different encoding (intervals of a depth-first leaf order), and the tests check one against the other.

Phrase trees are parent pointers over nodes: nodes `0 .. n_words-1` are the words (leaves, in sentence order),
nodes `n_words ..` are phrases, and the root's parent is `-1`.
"""

from __future__ import annotations

import numpy as np

# NOT_IN_PHRASE: the ``phrase_positions`` value for token pairs outside each other's local phrase, and for padding
# (Figure 3's infinity); the model clips the other values to ``[-k, k]`` and masks this one. Defined once, model side.
from hf_headattn.phrase_values import NOT_IN_PHRASE, RULE2
from hf_headattn.settings_checks import check_choice


def check_heads(heads) -> np.ndarray:
    """Validate dependency heads (`-1` for a root, else another word's index); raises `ValueError` naming it."""
    heads = np.asarray(heads, dtype=np.int64).reshape(-1)
    n = len(heads)
    bad = np.flatnonzero((heads < -1) | (heads >= n) | (heads == np.arange(n)))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"heads[{i}] = {int(heads[i])} is not a word index of this sentence other than {i} "
                         f"(expected -1 for the root or 0..{n - 1})")
    return heads


def dependency_mask(heads) -> np.ndarray:
    """Dependency mask of Eq. 5 for one sentence: True where `D_ij = 0`.

    `D_ij = 0` when `x_i, x_j` are in a head-dependent relation `Dep(x_i, x_j)` (either direction) or
    `i = j`; `-inf` (here False) otherwise.

    Parameters
    ----------
    heads : sequence of int, shape (n,)
        `heads[i]` is the index of word `i`'s head, `-1` for a root.

    Returns
    -------
    :
        np.ndarray of bool, shape (n, n)
    """
    heads = check_heads(heads)
    n = len(heads)
    mask = np.eye(n, dtype=bool)
    dependents = np.flatnonzero(heads >= 0)
    mask[dependents, heads[dependents]] = True
    return mask | mask.T


def check_tree(parents, n_words: int) -> np.ndarray:
    """Validate parent pointers of a phrase tree whose first `n_words` nodes are its leaves.

    Raises `ValueError` naming the bad node unless there is exactly one root, no cycle, and no word has children.
    """
    parents = np.asarray(parents, dtype=np.int64).reshape(-1)
    if n_words < 1 or len(parents) < n_words:
        raise ValueError(f"a phrase tree needs at least one word and one node per word; got n_words={n_words}, "
                         f"{len(parents)} nodes")
    bad = np.flatnonzero((parents < -1) | (parents >= len(parents)) | ((parents >= 0) & (parents < n_words)))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"parents[{i}] = {int(parents[i])}: expected -1 or a phrase node "
                         f"{n_words}..{len(parents) - 1} (nodes 0..{n_words - 1} are words and have no children)")
    roots = np.flatnonzero(parents < 0)
    if len(roots) != 1:
        raise ValueError(f"a phrase tree needs exactly one root (parent -1), found {len(roots)}: {roots.tolist()}")
    _depths(parents)  # raises on a cycle
    return parents


def _depths(parents: np.ndarray) -> np.ndarray:
    """Depth of every node (root 0), by pointer jumping; raises ValueError on a cycle."""
    n = len(parents)
    depth = np.zeros(n, dtype=np.int64)
    up = parents.copy()
    for _ in range(n + 1):
        live = up >= 0
        if not live.any():
            return depth
        depth[live] += 1
        up[live] = parents[up[live]]
    raise ValueError(f"the parent pointers {parents.tolist()} contain a cycle")


def _ancestors(parents: np.ndarray, node: int) -> list[int]:
    chain = []
    while parents[node] >= 0:
        node = int(parents[node])
        chain.append(node)
    return chain


def apply_rule2(rule1: np.ndarray, rule2: str = "symmetric") -> np.ndarray:
    """Rule 2 on Rule 1's relation `rule1[..., i, j]` (`x_j` in `local_phrase(x_i)`), indices in sentence order.

    `"symmetric"`: `rule1 | rule1^T`. `"literal"`: `rule1[i, j] | (rule1[j, i] & (j < i))`, Rule 2 as the
    paper prints it. (..., n, n) bool -> (..., n, n) bool.
    """
    check_choice(rule2, "rule2", RULE2)
    transposed = np.swapaxes(rule1, -1, -2)
    if rule2 == "literal":
        transposed = transposed & np.tri(rule1.shape[-1], k=-1, dtype=bool)  # j < i: below the diagonal
    return rule1 | transposed


def local_phrases(parents, n_words: int, rule2: str = "symmetric") -> np.ndarray:
    """Local phrases of Rules 1-2: `L[i, j]` is True when `x_j` is in `local_phrase(x_i)`.

    Rule 1: `local_phrase(x_i)` holds the words under the lowest ancestor of `x_i` that has more than one word
    below it (if none has, e.g. a one-word sentence, the `m = 0` case: `x_i` alone). Rule 2, as printed: if
    `x_i` is in `local_phrase(x_j)` (`j < i`), then `x_j` is in `local_phrase(x_i)`.

    `rule2="symmetric"` (default) drops the `j < i`: the symmetric closure, so that RP is antisymmetric like the
    Figure 3 example (`RP_held,talk = 1` and `RP_talk,held = -1`). `rule2="literal"` applies Rule 2 exactly as
    written, for `j < i` only: a later word `x_j` (`j > i`) is in `local_phrase(x_i)` only by Rule 1, and
    otherwise is "not in the same local-phrase", whose RP entry the Figure 3 text sets to infinity (masked). The
    relation is then asymmetric whenever a later word's Rule-1 phrase is the larger one. (Figure 3's sentence gives
    the same matrix under both readings.)

    Parameters
    ----------
    parents : sequence of int
        Phrase tree (see the module docstring).
    n_words : int
    rule2 : "symmetric" or "literal"

    Returns
    -------
    :
        np.ndarray of bool, shape (n_words, n_words)
    """
    parents = check_tree(parents, n_words)
    below = [set() for _ in parents]  # words under each node
    for w in range(n_words):
        for a in [w, *_ancestors(parents, w)]:
            below[a].add(w)
    rule1 = np.zeros((n_words, n_words), dtype=bool)
    for w in range(n_words):
        anchor = next((a for a in _ancestors(parents, w) if len(below[a]) > 1), w)
        rule1[w, sorted(below[anchor])] = True
    return apply_rule2(rule1, rule2)


def relative_phrasal_positions(parents, n_words: int, rule2: str = "symmetric") -> np.ndarray:
    """Relative phrasal position matrix RP of Figure 3.

    `RP[i, j] = layer(x_j) - layer(x_i)` when `x_j` is in `local_phrase(x_i)` (Rules 1-2, Rule 2 read as
    `rule2` says, see [`local_phrases`][hf_headattn.syntax_inputs.features.local_phrases]), where
    `layer` is the depth of a word in the phrase tree (root 0);
    [`NOT_IN_PHRASE`][hf_headattn.phrase_values.NOT_IN_PHRASE] (Figure 3's infinity) otherwise. Sign convention from the
    Figure 3 text: "held" is on layer 3 and "talk" on layer 4, and `RP_held,talk = 1`.

    Eq. 7 writes the relative-position embedding as `w_clip(j - i, k)`, but the text says the embeddings represent
    the entries of RP; we follow the text: the model embeds `clip(RP[i, j], k)`.

    Returns
    -------
    :
        np.ndarray of int64, shape (n_words, n_words)
    """
    parents = check_tree(parents, n_words)
    layer = _depths(parents)[:n_words]
    inside = local_phrases(parents, n_words, rule2)
    return np.where(inside, layer[None, :] - layer[:, None], NOT_IN_PHRASE)


def phrase_tree_features(parents, n_words: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """Encode Rules 1-2 and RP of a phrase tree in four integers per word.

    Words are numbered in a depth-first order of the tree (`rank`, the word order itself for a tree without
    crossing branches); the words under any node then have consecutive ranks, so `local_phrase(x_i)` by Rule 1
    is the rank interval `[start_i, end_i)` of `x_i`'s lowest multi-word ancestor. With `layer` the depth of
    each word:

    * Rule 1: `x_j` in `local_phrase(x_i)` iff `start_i <= rank_j < end_i`; Rule 2 adds the transpose (for
      `j < i` only in its literal reading, `apply_rule2`);
    * RP (Figure 3): `layer_j - layer_i` inside the local phrase.

    Returns
    -------
    :
        layer, rank, start, end : list of int, each of length n_words
    """
    parents = check_tree(parents, n_words)
    leftmost = np.arange(len(parents))  # smallest word index below each node: children are walked left to right
    for w in range(n_words):
        for a in _ancestors(parents, w):
            leftmost[a] = min(leftmost[a], w)
    children = [[] for _ in parents]
    for node in np.argsort(leftmost, kind="stable").tolist():
        if parents[node] >= 0:
            children[parents[node]].append(node)
    first = np.zeros(len(parents), dtype=np.int64)  # rank interval [first, last) of the words under each node
    last = np.zeros(len(parents), dtype=np.int64)
    rank = np.zeros(n_words, dtype=np.int64)
    next_rank = 0
    stack = [(int(np.flatnonzero(parents < 0)[0]), False)]
    while stack:  # iterative depth-first walk
        node, done = stack.pop()
        if done:
            last[node] = next_rank
            continue
        first[node] = next_rank
        if node < n_words:
            rank[node] = next_rank
            next_rank += 1
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(children[node]))
    start, end = rank.copy(), rank + 1  # m = 0 of Rule 1: no multi-word ancestor
    for w in range(n_words):
        anchor = next((a for a in _ancestors(parents, w) if last[a] - first[a] > 1), None)
        if anchor is not None:
            start[w], end[w] = first[anchor], last[anchor]
    layer = _depths(parents)[:n_words]
    return layer.tolist(), rank.tolist(), start.tolist(), end.tolist()


def token_dependency_mask(word: np.ndarray, head: np.ndarray) -> np.ndarray:
    """Token-level dependency mask (Eq. 5) for a padded batch.

    Subwords of one word share its relations and relate to each other. Tokens without a word (special tokens,
    padding: `word = -1`) relate only to themselves, so no row is all False. numpy, not torch: for tensors this
    small, torch's intra-op threads cost more than the work (100x on a busy 2-core machine).

    Parameters
    ----------
    word : int array, shape (B, T)
        Word index of each token, `-1` for special tokens and padding.
    head : int array, shape (B, T)
        Head word index of each token's word, `-1` for a root, special tokens and padding.

    Returns
    -------
    :
        bool array, shape (B, T, T)
    """
    has_word = word >= 0
    wi, wj = word[:, :, None], word[:, None, :]  # (B, T, 1), (B, 1, T)
    hi, hj = head[:, :, None], head[:, None, :]
    both = has_word[:, :, None] & has_word[:, None, :]  # (B, T, T)
    return (both & ((wi == wj) | (hi == wj) | (hj == wi))) | np.eye(word.shape[1], dtype=bool)


def token_phrase_positions(layer: np.ndarray, rank: np.ndarray, start: np.ndarray, end: np.ndarray,
                           present: np.ndarray, rule2: str = "symmetric") -> np.ndarray:
    """Token-level RP (Figure 3, Rules 1-2) for a padded batch, from
    [`phrase_tree_features`][hf_headattn.syntax_inputs.features.phrase_tree_features] per token.

    `rule2`: the reading of Rule 2 ([`local_phrases`][hf_headattn.syntax_inputs.features.local_phrases]); "literal"
    compares token positions, which follow the words' sentence order.

    Subwords of one word get that word's four integers, hence RP 0 among themselves. Special tokens carry
    `rank = -1` and an empty interval (`start = end = 0`): they are in no local phrase but their own, RP 0 on
    their diagonal. Padding (`present` False) is [`NOT_IN_PHRASE`][hf_headattn.phrase_values.NOT_IN_PHRASE] everywhere,
    diagonal included.

    Parameters
    ----------
    layer, rank, start, end
        int arrays, shape (B, T)
    present : bool array, shape (B, T)
        True for real (non-padding) tokens.

    Returns
    -------
    :
        int64 array, shape (B, T, T)
    """
    rule1 = (start[:, :, None] <= rank[:, None, :]) & (rank[:, None, :] < end[:, :, None])  # (B, T, T)
    inside = apply_rule2(rule1, rule2)
    inside |= np.eye(layer.shape[1], dtype=bool) & present[:, :, None]
    rp = layer[:, None, :] - layer[:, :, None]  # (B, T, T): layer_j - layer_i
    return np.where(inside, rp, NOT_IN_PHRASE).astype(np.int64)

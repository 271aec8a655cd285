"""Eq. 5, Rules 1-2 and the RP matrix of Figure 3 (RHE/SEA paper): hand-written examples, loops, invariants."""

import numpy as np
import pytest

from hf_headattn.syntax_inputs import (
    NOT_IN_PHRASE,
    dependency_mask,
    dependency_phrase_tree,
    local_phrases,
    parse_bracketed,
    phrase_tree_features,
    relative_phrasal_positions,
    token_dependency_mask,
    token_phrase_positions,
)

X = NOT_IN_PHRASE
# Figure 3's sentence. The text fixes: "held" on layer 3, "talk" on layer 4, RP_held,talk = 1, and "Sharon" and
# "talk" not in one local phrase. This PTB-style tree (flat VP) is the one that satisfies all three.
FIG3 = "(S (NP (NNP Bush)) (VP (VBD held) (NP (DT a) (NN talk)) (PP (IN with) (NP (NNP Sharon)))))"
#                  Bush held  a  talk with Sharon
FIG3_RP = np.array([[0, 0, 1, 1, 1, 2],   # Bush: lowest multi-word ancestor is S
                    [0, 0, 1, 1, 1, 2],   # held: VP
                    [-1, -1, 0, 0, X, X],  # a: NP "a talk", plus Bush, held by Rule 2
                    [-1, -1, 0, 0, X, X],  # talk
                    [-1, -1, X, X, 0, 1],  # with: PP "with Sharon"
                    [-2, -2, X, X, -1, 0]])  # Sharon
FIG3_HEADS = [1, -1, 3, 1, 1, 4]  # Bush<-held, a<-talk, talk<-held, with<-held, Sharon<-with


def test_figure3_relative_phrasal_positions():
    words, parents = parse_bracketed(FIG3)
    assert words == ["Bush", "held", "a", "talk", "with", "Sharon"]
    rp = relative_phrasal_positions(parents, len(words))
    np.testing.assert_array_equal(rp, FIG3_RP)
    assert rp[1, 3] == 1 and rp[3, 5] == NOT_IN_PHRASE  # the two entries the paper's text states
    np.testing.assert_array_equal(local_phrases(parents, len(words)), FIG3_RP != X)


def test_rule2_makes_local_phrases_symmetric():
    words, parents = parse_bracketed(FIG3)
    # Rule 1 alone: Sharon's phrase is "with Sharon", held's is the VP; Rule 2 adds held to Sharon's.
    lp = local_phrases(parents, len(words))
    assert lp[1, 5] and lp[5, 1]
    assert (lp == lp.T).all()


# Two 3-word trees, worked by hand. A: (S (X w0 w1) w2), layers 2, 2, 1. Rule 1: w0, w1 -> X = {w0, w1}; w2 -> S =
# all. Rule 2 adds w2 to the phrases of w0 and w1 (i = 0, 1 in local_phrase(x_2)), but only in the symmetric
# reading: as printed it needs j < i, and here j = 2 > i. B: (S w0 (X w1 w2)): Rule 1 gives w0 everything, and
# Rule 2 adds w0 (j = 0 < i) to the phrases of w1 and w2 in both readings.
TREE_A, TREE_B = [3, 3, 4, 4, -1], [4, 3, 3, 4, -1]
HAND_RP = {
    ("A", "symmetric"): [[0, 0, -1], [0, 0, -1], [1, 1, 0]],
    ("A", "literal"): [[0, 0, X], [0, 0, X], [1, 1, 0]],  # w2 is after w0, w1: in their phrase by Rule 1 only
    ("B", "symmetric"): [[0, 1, 1], [-1, 0, 0], [-1, 0, 0]],
    ("B", "literal"): [[0, 1, 1], [-1, 0, 0], [-1, 0, 0]],
}


@pytest.mark.parametrize("tree, rule2", sorted(HAND_RP))
def test_rule2_readings_on_hand_worked_trees(tree, rule2):
    parents = {"A": TREE_A, "B": TREE_B}[tree]
    expected = np.array(HAND_RP[tree, rule2])
    np.testing.assert_array_equal(relative_phrasal_positions(parents, 3, rule2=rule2), expected)
    np.testing.assert_array_equal(local_phrases(parents, 3, rule2=rule2), expected != X)


def test_figure3_is_the_same_under_both_readings_of_rule2():
    words, parents = parse_bracketed(FIG3)
    np.testing.assert_array_equal(relative_phrasal_positions(parents, len(words), rule2="literal"), FIG3_RP)
    with pytest.raises(ValueError, match=r"rule2 must be one of \('symmetric', 'literal'\), got 'as printed'"):
        local_phrases(parents, len(words), rule2="as printed")


def test_dependency_mask_eq5_hand_example():
    expected = np.array([[1, 1, 0, 0, 0, 0],
                         [1, 1, 0, 1, 1, 0],
                         [0, 0, 1, 1, 0, 0],
                         [0, 1, 1, 1, 0, 0],
                         [0, 1, 0, 0, 1, 1],
                         [0, 0, 0, 0, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(dependency_mask(FIG3_HEADS), expected)


def test_dependency_phrase_tree_hand_example():
    parents = dependency_phrase_tree(FIG3_HEADS)
    # phrase nodes: 6 = held's (root), 7 = talk's, 8 = with's
    assert parents == [6, 6, 7, 7, 8, 8, -1, 6, 6]
    rp = relative_phrasal_positions(parents, 6)
    assert rp[2, 3] == 0  # "a talk": a head and its leaf dependent share a layer
    assert rp[1, 3] == 1  # held (layer 1) -> talk (layer 2), as in Figure 3
    assert rp[3, 5] == NOT_IN_PHRASE  # talk vs Sharon, as in Figure 3
    assert rp[0, 5] == 1  # the root's phrase is the whole sentence


def test_one_word_sentence_is_its_own_phrase():
    assert dependency_phrase_tree([-1]) == [-1]
    np.testing.assert_array_equal(relative_phrasal_positions([-1], 1), [[0]])
    assert phrase_tree_features([-1], 1) == ([0], [0], [0], [1])
    np.testing.assert_array_equal(dependency_mask([-1]), [[True]])


@pytest.mark.parametrize("heads, match", [([1, 0], "exactly one root"), ([-1, 1], r"heads\[1\] = 1"),
                                          ([-1, 5], r"heads\[1\] = 5"), ([-1, 2, 1], "cycle")])
def test_bad_dependency_trees(heads, match):
    with pytest.raises(ValueError, match=match):
        dependency_phrase_tree(heads)


@pytest.mark.parametrize("parents, match", [([2, 0, -1], r"parents\[1\] = 0"), ([-1, 2, -1], "one root"),
                                            ([2, 3, 3, 2], "one root"), ([2, 2, 3, 2, -1], "cycle")])
def test_bad_phrase_trees(parents, match):
    with pytest.raises(ValueError, match=match):
        relative_phrasal_positions(parents, 2)


def random_tree(rng, n_words, n_phrases):
    """Random parent pointers: phrases hang under earlier phrases, words under any phrase (branches may cross)."""
    root = n_words
    phrase_parents = [-1] + [int(rng.integers(root, root + k)) for k in range(1, n_phrases)]
    return [int(rng.integers(root, root + n_phrases)) for _ in range(n_words)] + phrase_parents


def loop_rp(parents, n_words, rule2="symmetric"):
    """RP by the lowest common ancestor: x_j is in Rule-1 local_phrase(x_i) iff LCA(i, j) is at or below i's
    lowest multi-word ancestor; Rule 2 for every pair, or for j < i only ("literal")."""
    def chain(v):
        out = [v]
        while parents[out[-1]] >= 0:
            out.append(parents[out[-1]])
        return out

    def words_below(node):
        return sum(node in chain(w) for w in range(n_words))

    depth = [len(chain(w)) - 1 for w in range(n_words)]
    anchor_depth = []
    for w in range(n_words):
        anchor = next((a for a in chain(w)[1:] if words_below(a) > 1), w)
        anchor_depth.append(len(chain(anchor)) - 1)
    rp = np.full((n_words, n_words), NOT_IN_PHRASE)
    for i in range(n_words):
        for j in range(n_words):
            lca = next(a for a in chain(i) if a in chain(j))
            d = len(chain(lca)) - 1
            if d >= anchor_depth[i] or (d >= anchor_depth[j] and (rule2 == "symmetric" or j < i)):  # Rules 1, 2
                rp[i, j] = depth[j] - depth[i]
    return rp


def interval_rp(parents, n_words, rule2="symmetric"):
    layer, rank, start, end = map(np.array, phrase_tree_features(parents, n_words))
    rule1 = (start[:, None] <= rank[None, :]) & (rank[None, :] < end[:, None])
    later = np.arange(n_words)[None, :] > np.arange(n_words)[:, None]  # j > i
    inside = rule1 | (rule1.T if rule2 == "symmetric" else rule1.T & ~later)
    return np.where(inside, layer[None, :] - layer[:, None], NOT_IN_PHRASE)


@pytest.mark.parametrize("rule2", ["symmetric", "literal"])
@pytest.mark.parametrize("seed", range(30))
def test_rp_and_its_interval_encoding_equal_a_loop(seed, rule2):
    rng = np.random.default_rng(seed)
    n_words = int(rng.integers(1, 12))
    parents = random_tree(rng, n_words, int(rng.integers(1, 8)))
    expected = loop_rp(parents, n_words, rule2)
    rp = relative_phrasal_positions(parents, n_words, rule2=rule2)
    np.testing.assert_array_equal(rp, expected)
    np.testing.assert_array_equal(interval_rp(parents, n_words, rule2), expected)
    finite = rp != NOT_IN_PHRASE
    assert (np.diag(rp) == 0).all()
    if rule2 == "symmetric":
        assert (finite == finite.T).all()
        np.testing.assert_array_equal(rp[finite], -rp.T[finite])
    else:  # as printed: below the diagonal as symmetric, above it Rule 1 alone
        symmetric = relative_phrasal_positions(parents, n_words)
        np.testing.assert_array_equal(np.tril(rp), np.tril(symmetric))
        assert ((symmetric == rp) | (rp == NOT_IN_PHRASE)).all()


@pytest.mark.parametrize("seed", range(10))
def test_dependency_mask_equals_a_loop(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 15))
    heads = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]  # each word hangs under an earlier one
    perm = rng.permutation(n)  # shuffle word order
    inv = np.argsort(perm)
    heads = [-1 if heads[perm[i]] < 0 else int(inv[heads[perm[i]]]) for i in range(n)]
    mask = dependency_mask(heads)
    for i in range(n):
        for j in range(n):
            assert mask[i, j] == (i == j or heads[i] == j or heads[j] == i)


def loop_token_tensors(examples, src_len, left, rule2="symmetric"):
    """Per-token loop: subwords inherit their word's Eq. 5 / RP entries; special tokens only see themselves."""
    dep = np.zeros((len(examples), src_len, src_len), dtype=bool)
    rp = np.full((len(examples), src_len, src_len), NOT_IN_PHRASE)
    for b, (heads, parents, words) in enumerate(examples):
        wdep, wrp = dependency_mask(heads), relative_phrasal_positions(parents, len(heads), rule2=rule2)
        off = src_len - len(words) if left else 0
        for i in range(src_len):
            dep[b, i, i] = True
            for j in range(src_len):
                ti, tj = i - off, j - off
                if not (0 <= ti < len(words) and 0 <= tj < len(words)):
                    continue
                wi, wj = words[ti], words[tj]
                if wi >= 0 and wj >= 0:
                    dep[b, i, j], rp[b, i, j] = wdep[wi, wj], wrp[wi, wj]
                elif i == j:
                    rp[b, i, j] = 0
    return dep, rp


@pytest.mark.parametrize("rule2", ["symmetric", "literal"])
@pytest.mark.parametrize("left", [False, True])
def test_batched_token_builders_equal_a_loop(left, rule2):
    rng = np.random.default_rng(1)
    examples = []
    for _ in range(5):
        n = int(rng.integers(1, 8))
        heads = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
        parents = dependency_phrase_tree(heads) if rng.random() < 0.5 else random_tree(rng, n, 4)
        words = sorted(rng.integers(0, n, size=int(rng.integers(n, 2 * n + 1))).tolist()) + [-1] * 2  # + specials
        examples.append((heads, parents, words))
    src_len = max(len(w) for _, _, w in examples) + 1
    cols = {k: np.full((5, src_len), fill) for k, fill in
            (("word", -1), ("head", -1), ("layer", 0), ("rank", -1), ("start", 0), ("end", 0))}
    present = np.zeros((5, src_len), dtype=bool)
    for b, (heads, parents, words) in enumerate(examples):
        feats = phrase_tree_features(parents, len(heads))
        pos = slice(src_len - len(words), None) if left else slice(0, len(words))
        present[b, pos] = True
        cols["word"][b, pos] = words
        cols["head"][b, pos] = [heads[w] if w >= 0 else -1 for w in words]
        for k, f, special in zip(("layer", "rank", "start", "end"), feats, (0, -1, 0, 0)):
            cols[k][b, pos] = [f[w] if w >= 0 else special for w in words]
    dep = token_dependency_mask(cols["word"], cols["head"])
    rp = token_phrase_positions(cols["layer"], cols["rank"], cols["start"], cols["end"], present, rule2)
    exp_dep, exp_rp = loop_token_tensors(examples, src_len, left, rule2)
    np.testing.assert_array_equal(dep, exp_dep)
    np.testing.assert_array_equal(rp, exp_rp)
    assert dep.any(-1).all()  # no all-masked row, padding included
    assert (rp[~present] == NOT_IN_PHRASE).all()

"""The hooks a method changes an attention call with (``AttentionCall.add_score_bias``, ``add_score_mod``,
``take_over``; hf_headattn.scores), on a tiny model's attention modules with toy methods attached: two methods'
score biases on chosen heads add up on SDPA, eager and flex attention; flex score_mods compose; a relative-position
value term (Shaw et al. 2018) takes over its heads while the backend runs the others; combinations that cannot
compose are refused, naming both methods. Every value is checked against a float64 loop over (sentence, head, query)
that reads none of the package's code."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from conftest import TINY
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.attention import AttentionCall, AttentionMethod, attach_method, headattn_attention_forward
from hf_headattn.flex import FLEX
from hf_headattn.hf_compat import ALL_ATTENTION_FUNCTIONS, eager_attention_forward
from hf_headattn.scores import biased_mask, score_bias

B, H, T, D, K = 2, 4, 5, 4, 2
REAL = torch.tensor([[True] * 5, [True, True, True, False, False]])  # (B, S): sentence 1 has 3 real tokens
SCALING = D ** -0.5


class Bias(AttentionMethod):
    """A score bias and/or hard mask on some heads (a Gaussian locality bias has this form)."""

    def __init__(self, bias=None, allowed=None, heads=None):
        super().__init__()
        self.bias, self.allowed, self.heads = bias, allowed, heads

    def before(self, call):
        call.add_score_bias(self.bias, allowed=self.allowed, heads=self.heads)


class ScoreMod(AttentionMethod):
    def __init__(self, score_mod):
        super().__init__()
        self.score_mod = score_mod

    def before(self, call):
        call.add_score_mod(self.score_mod)


class RelativePositions(AttentionMethod):
    """Shaw et al. (2018), Eq. 3-4, on the heads it takes over: e_ij = q_i (k_j + w^K_{clip(j-i, k)}) * scaling,
    z_i = sum_j a_ij (v_j + w^V_{clip(j-i, k)}); the value term needs the probabilities. (A toy: positions are those of
    the call, no cache offset.)"""

    def __init__(self, heads, keys, values):
        super().__init__()
        self.heads, self.keys, self.values = heads, keys, values  # tables (2k+1, D)

    def before(self, call):
        call.take_over(self.heads, self.attend)

    def attend(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None):
        k = (self.keys.shape[0] - 1) // 2
        positions = torch.arange(key.shape[2])
        labels = (positions[None, :] - torch.arange(query.shape[2])[:, None]).clamp(-k, k) + k  # (T, S)
        scores = (query @ key.transpose(-1, -2) + torch.einsum("bhtd,tsd->bhts", query, self.keys[labels])) * scaling
        if attention_mask is not None:
            scores = (scores.masked_fill(~attention_mask, float("-inf")) if attention_mask.dtype == torch.bool
                      else scores + attention_mask)
        probs = torch.nn.functional.dropout(scores.softmax(-1), dropout, module.training)
        output = probs @ value + torch.einsum("bhts,tsd->bhtd", probs, self.values[labels])
        return output.transpose(1, 2), probs


def module_of(backend, side="encoder"):
    """Layer 0's self-attention of a tiny model (routed: its calls reach our attention function) on ``backend``."""
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, attention_dropout=0.0)).eval()
    model.set_attn_implementation(backend)
    return getattr(model.model, side).layers[0].self_attn


def attach(module, **methods):
    for name, method in methods.items():
        attach_method(module, name, method)
    return module


def qkv(dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_(grad) for _ in range(3)]


def padding_mask(backend, dtype=torch.float32):
    """What transformers passes encoder self-attention: keys masked, bool (SDPA) or additive finfo.min (eager)."""
    allowed = REAL[:, None, None, :].expand(B, 1, T, T)
    if backend == "sdpa":
        return allowed
    return torch.zeros(B, 1, T, T, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def base_allowed(side):
    """(B, T, S) bool: the keys the call's own mask allows (padding for the encoder, causality for the decoder)."""
    if side == "encoder":
        return REAL[:, None, :].expand(B, T, T)
    return torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)


def reference(query, key, value, allowed, terms, relative=None):
    """Attention in float64 by loops over (sentence, head, query): softmax of q k^T * scaling plus each term's bias,
    -inf where the call's mask (``allowed``, (B, T, S)) or a term's hard mask forbids a key; a term applies to head h of
    sentence b where chosen, and only on the rows its hard mask leaves a key the call's mask allows. ``terms``:
    (bias (B, H, T, S) or None, hard (B, H, T, S) or None, chosen (B, H) bool). ``relative``: (heads, w^K, w^V) of
    Shaw et al.'s terms on those heads. Returns (B, T, H, D)."""
    query, key, value = (tensor.detach().double() for tensor in (query, key, value))
    out = torch.zeros(B, T, H, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                scores = torch.stack([query[b, h, i] @ key[b, h, j] for j in range(T)]) * SCALING
                keep = allowed[b, i].clone()
                for bias, hard, chosen in terms:
                    if not chosen[b, h] or (hard is not None and not (hard[b, h, i] & allowed[b, i]).any()):
                        continue
                    if bias is not None:
                        scores = scores + bias[b, h, i].double()
                    if hard is not None:
                        keep = keep & hard[b, h, i]
                rel = relative is not None and h in relative[0]
                if rel:
                    labels = [min(max(j - i, -K), K) + K for j in range(T)]
                    w_k, w_v = relative[1].double(), relative[2].double()
                    scores = scores + torch.stack([query[b, h, i] @ w_k[label] for label in labels]) * SCALING
                probs = scores.masked_fill(~keep, float("-inf")).softmax(-1)
                out[b, i, h] = probs @ value[b, h]
                if rel:
                    out[b, i, h] += sum(probs[j] * w_v[labels[j]] for j in range(T))
    return out


def toy_terms(dtype=torch.float32, grad=False):
    """Two toy methods' biases: ``first`` on heads 0 and 2 by number (one bias per head, (1, 2, T, S)), ``second`` a
    hard mask and a bias shared by the heads (B, 1, T, S) on a per-sentence selection; its hard mask leaves sentence
    1's row 4 only a padding key (that row keeps the call's mask alone there). Returns the methods and their terms on
    the call's heads for :func:`reference`."""
    g = torch.Generator().manual_seed(5)
    first = torch.randn(1, 2, T, T, generator=g, dtype=dtype).requires_grad_(grad)
    second = torch.randn(B, 1, T, T, generator=g, dtype=dtype).requires_grad_(grad)
    hard = (torch.rand(B, 1, T, T, generator=g) < 0.5) | torch.eye(T, dtype=torch.bool)
    hard[1, 0, 4] = torch.arange(T) == 4
    chosen = torch.tensor([[True, False, True, True], [False, True, True, False]])
    first_full = torch.zeros(B, H, T, T, dtype=dtype)
    first_full[:, [0, 2]] = first.detach()
    terms = [(first_full, None, torch.tensor([[True, False, True, False]] * B)),
             (second.detach().expand(B, H, T, T), hard.expand(B, H, T, T), chosen)]
    methods = {"first": Bias(first, heads=(0, 2)), "second": Bias(second, allowed=hard, heads=chosen)}
    return methods, terms


@pytest.mark.parametrize("side", ["encoder", "decoder"])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_two_methods_score_biases_add_up(backend, side):
    """Encoder self-attention with the padding mask, decoder self-attention with causality (on SDPA transformers
    passes no mask there: is_causal), and the first bias's gradient is the reference's."""
    methods, terms = toy_terms(grad=True)
    module = attach(module_of(backend, side), **methods)
    query, key, value = qkv()
    mask = padding_mask(backend) if side == "encoder" else (None if backend == "sdpa" else torch.zeros(B, 1, T, T)
                                                            .masked_fill(~base_allowed(side)[:, None], -3.4e38))
    output, _ = headattn_attention_forward(module, query, key, value, mask, scaling=SCALING)
    expected = reference(query, key, value, base_allowed(side), terms)
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)
    output.square().sum().backward()
    first = methods["first"].bias
    by_hand = first.detach().double().requires_grad_()
    terms[0][0][:, [0, 2]] = by_hand.float()  # (differentiable through the reference's bias)
    full = torch.zeros(B, H, T, T, dtype=torch.float64)
    full[:, [0, 2]] = by_hand
    reference(query, key, value, base_allowed(side), [(full, None, terms[0][2]), terms[1]]).square().sum().backward()
    torch.testing.assert_close(first.grad.double(), by_hand.grad, atol=1e-4, rtol=1e-4)


class MaskSpy(AttentionMethod):
    """Keeps the mask the backend applied (``call.mask_tensor`` in ``after``)."""

    def after(self, call, attn_output):
        self.mask = call.mask_tensor
        return attn_output


@pytest.mark.parametrize("with_bias", [False, True])
def test_one_methods_bias_on_heads_by_number(with_bias):
    """One method's hard mask (and bias) that differ between the heads it names, (3, 1): combined at its own size
    and spread over the heads once; SDPA gets a bool mask where it is a hard mask only, and ``mask_tensor`` in
    ``after`` is what the backend got."""
    g = torch.Generator().manual_seed(7)
    hard = (torch.rand(B, 2, T, T, generator=g) < 0.5) | torch.eye(T, dtype=torch.bool)
    bias = torch.randn(1, 2, T, T, generator=g) if with_bias else None
    module = attach(module_of("sdpa"), named=Bias(bias, allowed=hard, heads=(3, 1)), spy=MaskSpy())
    query, key, value = qkv()
    output, _ = headattn_attention_forward(module, query, key, value, padding_mask("sdpa"), scaling=SCALING)
    full_bias, full_hard = torch.zeros(B, H, T, T), torch.ones(B, H, T, T, dtype=torch.bool)
    full_hard[:, [3, 1]] = hard
    if with_bias:
        full_bias[:, [3, 1]] = bias
    chosen = torch.tensor([[False, True, False, True]] * B)
    expected = reference(query, key, value, base_allowed("encoder"), [(full_bias, full_hard, chosen)])
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)
    mask = module.spy.mask
    assert mask.shape == (B, H, T, T) and mask.dtype == (torch.float32 if with_bias else torch.bool)
    again = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=SCALING)
    torch.testing.assert_close(again.transpose(1, 2), output)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_two_hard_masks_that_empty_a_row_leave_it_the_calls_mask(backend):
    """Each hard mask leaves every row a key, together they leave row 0 none: that row keeps the call's padding mask
    alone (it attends as without the masks, never to padding, never NaN); the other rows get both masks."""
    first, second = (torch.ones(B, 1, T, T, dtype=torch.bool) for _ in range(2))
    first[:, :, 0], second[:, :, 0] = torch.arange(T) == 0, torch.arange(T) == 1
    module = attach(module_of(backend), first=Bias(allowed=first), second=Bias(allowed=second))
    query, key, value = qkv()
    output, weights = headattn_attention_forward(module, query, key, value, padding_mask(backend), scaling=SCALING)
    both = (first & second).expand(B, H, T, T)
    chosen = torch.ones(B, H, dtype=torch.bool)
    expected = reference(query, key, value, base_allowed("encoder"), [(None, both, chosen)])
    plain = reference(query, key, value, base_allowed("encoder"), [])
    torch.testing.assert_close(output[:, 1:].double(), expected[:, 1:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(output[:, 0].double(), plain[:, 0], atol=1e-5, rtol=1e-5)
    if backend == "eager":
        assert not weights[1, :, :, 3:].any()  # sentence 1's padding keys


def test_biases_gradcheck_on_the_mask():
    """float64 gradcheck of the mask made of a bias on heads by number and one on a per-sentence selection with a
    hard mask (each spread to the heads on its own), through SDPA."""
    g = torch.Generator().manual_seed(1)
    hard = (torch.rand(B, 1, T, T, generator=g) < 0.5) | torch.eye(T, dtype=torch.bool)
    chosen = torch.rand(B, H, generator=g) < 0.5
    query, key, value = qkv(torch.float64)

    def attention(first, second):
        terms = [score_bias("first", first, None, (3, 1), (B, H, T, T)),
                 score_bias("second", second, hard, chosen, (B, H, T, T))]
        mask = biased_mask(REAL[:, None, None, :], terms, torch.float64)
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)

    biases = (torch.randn(B, 2, T, T, dtype=torch.float64, generator=g).requires_grad_(),
              torch.randn(B, 1, T, T, dtype=torch.float64, generator=g).requires_grad_())
    assert torch.autograd.gradcheck(attention, biases)


def call_on_flex(**methods):
    """An attention call as flex attention gets it (a BlockMask of the padding), after ``methods``' ``before``."""
    block = create_block_mask(lambda b, h, q, kv: REAL[b, kv], B=B, H=None, Q_LEN=T, KV_LEN=T, device="cpu")
    query, key, value = qkv()
    module = attach(module_of(FLEX), **methods)
    call = AttentionCall(module, query, key, value, block, SCALING, None, None, {}, implementation=FLEX)
    for name, method in methods.items():
        call._method = name
        method.before(call)
    return call


def scores_by_score_mod(call):
    """The call's flex score_mod applied to q k^T * scaling for every (sentence, head, query, key) at once (the
    indices broadcast), as flex attention applies it entry by entry."""
    index = [torch.arange(n).reshape([-1 if axis == d else 1 for axis in range(4)]) for d, n in enumerate((B, H, T, T))]
    return call._flex_score_mod()(call.query @ call.key.transpose(-1, -2) * SCALING, *index)


def test_flex_score_mods_compose_with_the_biases():
    """Two methods' biases and two methods' score_mods on one flex call: one score_mod that applies them in order.
    With the first three, the scores give the reference's attention (the padding is the block mask's); the fourth
    then doubles the diagonal of what they gave."""
    methods, terms = toy_terms()
    shift = torch.randn(H, generator=torch.Generator().manual_seed(2))
    third = ScoreMod(lambda score, b, h, q, k: score + shift[h])
    three = scores_by_score_mod(call_on_flex(**methods, third=third))
    call = call_on_flex(**methods, third=third,
                        fourth=ScoreMod(lambda score, b, h, q, k: torch.where(q == k, score * 2, score)))
    eye = torch.eye(T, dtype=torch.bool)
    assert torch.equal(scores_by_score_mod(call), torch.where(eye, three * 2, three))
    attention = three.masked_fill(~REAL[:, None, None, :], float("-inf")).softmax(-1) @ call.value  # (B, H, T, D)
    shifted = (shift[None, :, None, None].expand(B, H, T, T), None, torch.ones(B, H, dtype=torch.bool))
    expected = reference(call.query, call.key, call.value, base_allowed("encoder"), [*terms, shifted])
    torch.testing.assert_close(attention.transpose(1, 2).double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_a_value_term_takes_over_its_heads(backend, side):
    """Shaw et al.'s relative positions on heads 3 and 1 (in that order), beside a bias on every head: the taken-over
    heads are the reference's (their mask has the causality and the other method's bias in it), the others too, and
    without the bias the heads not taken over are the stock backend's output on all heads."""
    g = torch.Generator().manual_seed(3)
    tables = torch.randn(2, 2 * K + 1, D, generator=g)
    bias = torch.randn(B, 1, T, T, generator=g)
    query, key, value = qkv()
    mask = padding_mask(backend) if side == "encoder" else (None if backend == "sdpa" else torch.zeros(B, 1, T, T)
                                                            .masked_fill(~base_allowed(side)[:, None], -3.4e38))
    module = attach(module_of(backend, side), bias=Bias(bias), shaw=RelativePositions((3, 1), *tables))
    output, weights = headattn_attention_forward(module, query, key, value, mask, scaling=SCALING)
    all_heads = [(bias.expand(B, H, T, T), None, torch.ones(B, H, dtype=torch.bool))]
    expected = reference(query, key, value, base_allowed(side), all_heads, relative=((3, 1), *tables))
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)
    assert weights is None if backend == "sdpa" else weights.shape == (B, H, T, T)

    module = attach(module_of(backend, side), shaw=RelativePositions((3, 1), *tables))
    output, weights = headattn_attention_forward(module, query, key, value, mask, scaling=SCALING)
    stock = ALL_ATTENTION_FUNCTIONS[backend] if backend == "sdpa" else eager_attention_forward
    plain, plain_weights = stock(module, query, key, value, mask, scaling=SCALING)
    torch.testing.assert_close(output[:, :, [0, 2]], plain[:, :, [0, 2]], atol=1e-6, rtol=1e-6)
    expected = reference(query, key, value, base_allowed(side), [], relative=((3, 1), *tables))
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)
    if backend == "eager":  # the taken-over heads' weights are put back in place
        torch.testing.assert_close(weights[:, [0, 2]], plain_weights[:, [0, 2]])


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_the_taken_over_path_gradchecks(backend):
    """float64 gradcheck of the attention function through the taken-over heads (q, k, v and both tables) beside the
    backend's heads."""
    g = torch.Generator().manual_seed(4)
    tables = [torch.randn(2 * K + 1, D, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2)]
    query, key, value = qkv(torch.float64, grad=True)
    mask = padding_mask(backend, torch.float64)
    shaw = RelativePositions((2,), *tables)
    module = attach(module_of(backend).double(), shaw=shaw)

    def attention(query, key, value, keys, values):
        shaw.keys, shaw.values = keys, values
        return headattn_attention_forward(module, query, key, value, mask, scaling=SCALING)[0]

    assert torch.autograd.gradcheck(attention, (query, key, value, *tables))


class ValuesOnly(AttentionMethod):
    """Takes over `heads` with an output read from the values alone (as fixed attention's heads: their q and k get
    no gradient): each query's output is the mean of the real keys' values plus its position."""

    def __init__(self, heads):
        super().__init__()
        self.heads = heads

    def before(self, call):
        call.take_over(self.heads, self.attend)

    def attend(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None):
        real = REAL[:, None, :, None].to(value.dtype)  # (B, 1, S, 1)
        mean = (value * real).sum(2, keepdim=True) / real.sum(2, keepdim=True)
        output = mean + torch.arange(query.shape[2], dtype=value.dtype)[:, None]
        return output.transpose(1, 2), None


@pytest.mark.parametrize("heads", [(0, 1), (2, 0), (3,)], ids=str)
def test_heads_that_read_only_values_gradcheck_in_hf_layout(heads):
    """float64 gradcheck of the attention function with heads taken over by a method that reads only V, q/k/v
    given as transformers makes them (views of (B, T, H, D)): the backend's heads' gradients, the taken heads'
    (zero for q and k), put together in HF's layout, in a run and out of one."""
    module = attach(module_of("sdpa").double(), values=ValuesOnly(heads))
    mask = padding_mask("sdpa")
    bases = [t.transpose(1, 2).contiguous().requires_grad_() for t in qkv(torch.float64)]  # (B, T, H, D)

    def attention(*bases, hook=None):
        query, key, value = (base.transpose(1, 2) for base in bases)
        for tensor in (query, key, value) if hook else ():
            tensor.register_hook(hook)
        return headattn_attention_forward(module, query, key, value, mask, scaling=SCALING)[0]

    assert torch.autograd.gradcheck(attention, bases)
    grads = []
    attention(*bases, hook=grads.append).sum().backward()
    assert all(grad.transpose(1, 2).is_contiguous() for grad in grads)  # in HF's layout: its view needs no copy
    rest = [head for head in range(H) if head not in heads]
    assert not bases[0].grad[:, :, list(heads)].any() and bases[0].grad[:, :, rest].all()


def test_taking_over_with_the_eager_function_changes_nothing():
    """Heads taken over by transformers' own eager function: the output and weights are eager's on every head."""

    class Eager(AttentionMethod):
        def before(self, call):
            call.take_over((2, 0), eager_attention_forward)

    query, key, value = qkv()
    module = attach(module_of("eager"), eager=Eager())
    mask = padding_mask("eager")
    output, weights = headattn_attention_forward(module, query, key, value, mask, scaling=SCALING)
    plain, plain_weights = eager_attention_forward(module, query, key, value, mask, scaling=SCALING)
    torch.testing.assert_close(output, plain)
    torch.testing.assert_close(weights, plain_weights)


@pytest.mark.parametrize("groups", [
    [(0, 1)], [(2, 3)], [(1, 2)], [(0,), (2, 3)], [(3,), (1,)], [(0, 1, 2, 3)], [(2, 0)], [(1,), (3, 0)],
    [(1, 0, 2, 3)], [(0, 1), (3,)],
], ids=str)
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_heads_taken_over_in_any_grouping_are_put_back_in_place(backend, groups):
    """Heads taken over by transformers' own backend function (one method per group) beside the backend's heads, under
    per-head score biases (a (B, H, T, S) mask to cut): in every grouping (runs of heads cut as views, in or out of
    head order, several groups; heads out of order; a backend's group that is no run) the output, eager's weights and
    the gradients of q/k/v and the bias are the backend's on every head."""

    class TakeOver(AttentionMethod):
        def __init__(self, heads):
            super().__init__()
            self.heads = heads

        def before(self, call):
            call.take_over(self.heads, ALL_ATTENTION_FUNCTIONS[backend] if backend == "sdpa" else
                           eager_attention_forward)

    bias = torch.randn(1, H, T, T, generator=torch.Generator().manual_seed(7), requires_grad=True)
    mask = padding_mask(backend)
    results = []
    for taken in (groups, []):
        query, key, value = qkv(grad=True)
        methods = {"bias": Bias(bias)} | {f"take{i}": TakeOver(heads) for i, heads in enumerate(taken)}
        module = attach(module_of(backend), **methods)
        output, weights = headattn_attention_forward(module, query, key, value, mask, scaling=SCALING)
        bias.grad = None
        (output * torch.arange(1.0, H + 1)[:, None]).sum().backward()
        results.append((output, weights, [t.grad for t in (query, key, value, bias)]))
    (output, weights, grads), (plain, plain_weights, plain_grads) = results
    torch.testing.assert_close(output, plain)
    if backend == "eager":
        torch.testing.assert_close(weights, plain_weights)
    for grad, plain_grad in zip(grads, plain_grads):
        torch.testing.assert_close(grad, plain_grad)


@pytest.fixture
def fresh_compiles():
    """Flex attention compiled afresh (see tests/test_flex.py: a torch 2.13 CPU recompile bug)."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


@pytest.mark.slow
@pytest.mark.lowest_only  # torch's flex kernels / compiler: tests/conftest.py's LOWEST_ONLY
def test_biases_and_a_taken_over_head_on_flex(fresh_compiles):
    """Flex attention (forward: the CPU has no flex backward) with the two toy methods' biases as its score_mod on
    three heads and Shaw et al.'s value term taking over the fourth (its mask: the block mask's padding with both
    biases in it): the reference's output."""
    methods, terms = toy_terms()
    tables = torch.randn(2, 2 * K + 1, D, generator=torch.Generator().manual_seed(6))
    module = attach(module_of(FLEX), **methods, shaw=RelativePositions((3,), *tables))
    block = create_block_mask(lambda b, h, q, kv: REAL[b, kv], B=B, H=None, Q_LEN=T, KV_LEN=T, device="cpu")
    query, key, value = qkv()
    with torch.no_grad():
        output, _ = headattn_attention_forward(module, query, key, value, block, scaling=SCALING)
    expected = reference(query, key, value, base_allowed("encoder"), terms, relative=((3,), *tables))
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)


def test_combinations_that_cannot_compose_are_refused_naming_both():
    query, key, value = qkv()

    class TakeOver(AttentionMethod):
        def __init__(self, heads):
            super().__init__()
            self.heads = heads

        def before(self, call):
            call.take_over(self.heads, eager_attention_forward)

    module = attach(module_of("sdpa"), first=TakeOver((1,)), second=TakeOver((2, 1)))
    with pytest.raises(ValueError, match=r"'second' takes over heads \[2, 1\] and 'first' heads \[1\]; expected each "
                                         r"head taken over by one method"):
        headattn_attention_forward(module, query, key, value, None, scaling=SCALING)
    module = attach(module_of("sdpa"), mod=ScoreMod(lambda score, b, h, q, k: score))
    with pytest.raises(ValueError, match=r"mod: add_score_mod needs attn_implementation 'flex_attention', got 'sdpa'; "
                                         r"expected call.add_score_bias"):
        headattn_attention_forward(module, query, key, value, None, scaling=SCALING)

    class Overwrites(AttentionMethod):
        def before(self, call):
            call.score_mod = lambda score, b, h, q, k: score

    module = attach(module_of("sdpa"), old=Overwrites())
    with pytest.raises(ValueError, match=r"old: setting call.score_mod would overwrite another method's"):
        headattn_attention_forward(module, query, key, value, None, scaling=SCALING)
    # flex: a raw score_mod has no tensor form, for a method that reads the mask or takes over heads (a bias has:
    # the mask SDPA would get)
    bias = torch.randn(B, 1, T, T)
    call = call_on_flex(first=Bias(bias))
    expected = biased_mask(REAL[:, None, None, :], [score_bias("first", bias, None, None, (B, H, T, T))],
                           torch.float32, boolean=True)
    torch.testing.assert_close(call.mask_tensor, expected)
    call = call_on_flex(first=ScoreMod(lambda score, b, h, q, k: score))
    call._method = "reader"
    with pytest.raises(ValueError, match=r"encoder\.layers\.0\.self_attn: a method's flex score_mod \(from 'first'\) "
                                         r"changed this call's mask, which 'reader' reads as a tensor"):
        call.mask_tensor
    module = attach(module_of(FLEX), mod=ScoreMod(lambda score, b, h, q, k: score), shaw=TakeOver((0,)))
    with pytest.raises(ValueError, match=r"a flex score_mod from 'mod' has no tensor form, which the heads 'shaw' take "
                                         r"over need"):
        headattn_attention_forward(module, query, key, value, call.attention_mask, scaling=SCALING)
    with pytest.raises(ValueError, match=r"first: bias of shape \(2, 3, 5, 5\) does not broadcast to \(batch, heads, "
                                         r"query, key\) = \(2, 4, 5, 5\)"):
        call_on_flex(first=Bias(torch.zeros(B, 3, T, T)))
    with pytest.raises(ValueError, match=r"first: heads \[0, 0\] must be distinct head numbers in \[0, 4\)"):
        call_on_flex(first=Bias(torch.zeros(T, T), heads=(0, 0)))

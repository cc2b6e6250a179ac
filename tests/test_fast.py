"""Each piece of transformer.fast held equal to the reference it stands in for, on the shapes the tasks train:
fp32 forward values and gradients within 1e-5 of the reference's largest magnitude; under bf16 autocast
within 3e-2 (bfloat16 keeps 8 bits of mantissa, and the two forms round in different places)."""

import pytest
import torch
from torch import nn

from lib.core.text import load_params
from transformer.config import ModelConfig
from transformer.fast import speed_up
import transformer.fast.attention as fast_attention
from transformer.fast.attention import FastMultiHeadAttention, fused_attention, grouped_attention
from transformer.fast.dropout import ByteDropout
from transformer.fast.loss import generator_nll
from transformer.attention import MultiHeadAttention, attention
from transformer.beam import beam_search
from transformer.config import SpecialIds
from transformer.greedy import greedy_search
from transformer.loss import label_smoothed_nll
from transformer.masks import causal_mask, padding_mask, target_mask
from transformer.positions import alibi_bias, alibi_slopes
from transformer.model import build_model
from tests.conftest import ROOT

PAD = 0
SPECIAL = SpecialIds(pad=PAD, bos=1, eos=2, unk=3)
FP32, BF16 = 1e-5, 3e-2
# Each task's model and a batch of its shape: (kind, vocabulary, batch, source length, target length).
SHAPES = {"cumsum": ("seq2seq", 40, 16, 13, 14), "multi30k": ("seq2seq", 8000, 8, 24, 26),
          "shakespeare": ("lm", 65, 4, 0, 128)}


def task_config(task: str, **overrides) -> ModelConfig:
    model = load_params(ROOT / "params.yaml")[task]["train"]["model"]
    return ModelConfig(**{**model, "dropout": 0.0, "activation_dropout": 0.0, **overrides})


def close(got: torch.Tensor, want: torch.Tensor, tolerance: float) -> bool:
    """Within ``tolerance`` of the reference's largest magnitude (at least 1)."""
    return (got.float() - want.float()).abs().max().item() <= tolerance * max(1.0, want.abs().max().item())


def padded_ids(batch: int, length: int, vocab: int) -> torch.Tensor:
    ids = torch.randint(4, vocab, (batch, length))
    for row in range(1, batch):  # each row shorter than the last, the first whole
        ids[row, length - row:] = PAD
    return ids


def reference_and_fast(task: str, **overrides):
    kind, vocab, *_ = SHAPES[task]
    reference = build_model(task_config(task, **overrides), kind, vocab, vocab, True)
    fast = build_model(task_config(task, **overrides), kind, vocab, vocab, True, fast=True)
    fast.load_state_dict(reference.state_dict())
    return reference, fast


def forward_and_grads(model, task: str, inputs):
    model.zero_grad()
    if SHAPES[task][0] == "lm":
        out = model(inputs[0])
    else:
        src, tgt = inputs
        out = model(src, tgt, padding_mask(src, PAD), target_mask(tgt, PAD))
    (out.float() ** 2).mean().backward()
    return out, {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("task", list(SHAPES))
def test_the_fast_model_is_the_reference_model(task, precision):
    """build_model(fast=True): the same parameters, the same state dict; the same logits and gradients."""
    kind, vocab, batch, S, T = SHAPES[task]
    reference, fast = reference_and_fast(task)
    assert [type(m) for m in fast.modules()].count(FastMultiHeadAttention) > 0
    assert list(reference.state_dict()) == list(fast.state_dict())
    inputs = ((padded_ids(batch, T, vocab),) if kind == "lm" else
              (padded_ids(batch, S, vocab), padded_ids(batch, T, vocab)))
    tolerance = FP32 if precision == "fp32" else BF16
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        want, want_grads = forward_and_grads(reference, task, inputs)
        got, got_grads = forward_and_grads(fast, task, inputs)
    assert close(got, want, tolerance)
    for name, grad in want_grads.items():
        assert close(got_grads[name], grad, tolerance), name


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kv_heads", [0, 2, 1])
@pytest.mark.parametrize("positional", ["sinusoidal", "rope", "alibi"])
@pytest.mark.parametrize("d_head", [None, 24])  # 24: heads narrower than d_model / n_heads (Table 3's rows B)
def test_fast_multi_head_attention_is_the_reference(fused, kv_heads, positional, d_head):
    """Self attention (causal, padded), cross attention and cached decoding, at multi30k's width."""
    cfg = task_config("multi30k")
    args = (cfg.d_model, cfg.n_heads, 0.0, fused, positional, cfg.max_len, True, 10000.0, kv_heads, d_head)
    reference, fast = MultiHeadAttention(*args), FastMultiHeadAttention(*args)
    fast.load_state_dict(reference.state_dict())
    x, memory = torch.randn(4, 11, cfg.d_model, requires_grad=True), torch.randn(4, 9, cfg.d_model)
    ids = padded_ids(4, 9, 50)
    for kwargs in ({"mask": target_mask(padded_ids(4, 11, 50), PAD)},
                   {"memory": memory, "mask": padding_mask(ids, PAD)}):
        outs = []
        for module in (reference, fast):
            x.grad = None
            out, weights = module(x, **kwargs, need_weights=True)
            out.pow(2).sum().backward()
            outs.append((out, weights, x.grad))
        for got, want in zip(outs[1], outs[0]):
            assert close(got, want, FP32)
    with torch.no_grad():  # a search's 3 beams a sentence over its one memory row, as 3 copies of it give
        beams = torch.randn(12, 2, cfg.d_model)
        want = reference(beams, memory.repeat_interleave(3, 0), padding_mask(ids, PAD).repeat_interleave(3, 0),
                         need_weights=True)
        for module in (reference, fast):
            got = module(beams, memory, padding_mask(ids, PAD), need_weights=True)
            assert close(got[0], want[0], FP32) and close(got[1], want[1], FP32)
    caches = [{}, {}, {"size": 5}]  # the fast one's twice: grown as the reference grows it, and set aside
    x = x.detach()
    for step in range(3):  # incremental decoding (as searches run it: no grad), the same outputs
        new = x[:, step:step + 1]
        mask = causal_mask(1, start=step)
        with torch.no_grad():
            steps = [m(new, mask=mask, cache=c, start=step)[0] for m, c in zip((reference, fast, fast), caches)]
        assert close(steps[1], steps[0], FP32) and close(steps[2], steps[0], FP32)
        if step == 1:  # a search keeps rows 3, 3 and 0: the same rows of every cache, in place in the fast one's
            rows = torch.tensor([3, 3, 0])
            for module, cache in zip((reference, fast, fast), caches):
                module.select_cache(cache, rows)
            x = x[rows]
    assert caches[2]["k"].data_ptr() == caches[2]["k_buffer"].data_ptr() and caches[2]["k_buffer"].size(2) == 5
    assert torch.equal(caches[2]["k"], caches[1]["k"]) and torch.equal(caches[2]["v"], caches[1]["v"])


def test_a_search_on_the_fast_model_finds_what_it_finds_on_the_reference():
    """Greedy and beam search through the fast modules' set-aside cache, sentences leaving the batch as they
    finish: the reference's outputs and scores."""
    reference, fast = reference_and_fast("multi30k")
    reference.eval(), fast.eval()
    with torch.no_grad():  # sharper than at initialisation, so that outputs end at different steps
        for model in (reference, fast):
            model.generator.weight.mul_(8.0)
    src = padded_ids(6, 9, reference.generator.out_features)
    limit = (src != PAD).sum(1) + 3
    for search in (lambda m: [[h] for h in greedy_search(m, src, SPECIAL, limit, alpha=0.6)],
                   lambda m: beam_search(m, src, SPECIAL, limit, beam_size=3, alpha=0.6, n_best=3)):
        want, got = search(reference), search(fast)
        assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in want]
        assert [h.score for hs in got for h in hs] == pytest.approx([h.score for hs in want for h in hs], abs=1e-5)
        assert len({len(hs[0].tokens) for hs in want}) > 1


def test_grouped_attention_is_eq_1_and_gives_a_query_with_no_key_zeros():
    q, k, v = torch.randn(2, 6, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    mask[1, :, 2] = False  # query 2 of the second row may attend to nothing
    for got, want in zip(grouped_attention(q, k, v, mask), attention(q, k, v, mask)):
        assert close(got, want, FP32)
    assert torch.all(grouped_attention(q, k, v, mask)[1][1, :, 2] == 0)


def no_key_mask(ids: torch.Tensor) -> torch.Tensor:
    """The target mask of ``ids`` (padding and causal), with query 2 of the last row left no key at all."""
    mask = target_mask(ids, PAD).expand(ids.size(0), 1, ids.size(1), ids.size(1)).clone()
    mask[-1, :, 2] = False
    return mask


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("masking", ["padding", "causal", "no key", "alibi"])
@pytest.mark.parametrize("kv_heads", [8, 2])
def test_fused_attention_is_eq_1(precision, masking, kv_heads):
    """torch's fused kernel (the fast path off the CPU, where no caller reads the weights) against the
    reference eq. 1: the output and the gradients of q, k and v, a query with no key given zeros."""
    B, H, T, D = 4, 8, 11, 16
    ids = padded_ids(B, T, 50)
    mask = {"padding": padding_mask(ids, PAD), "causal": target_mask(ids, PAD), "no key": no_key_mask(ids),
            "alibi": no_key_mask(ids)}[masking]
    bias = alibi_bias(alibi_slopes(H), T, T) if masking == "alibi" else None
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    bias = None if bias is None else bias.to(dtype)
    results = []
    for attend in (lambda q, k, v: attention(q, k, v, mask, None, bias)[0],
                   lambda q, k, v: fused_attention(q, k, v, mask, 0.0, bias)):
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, heads, T, D, dtype=dtype, requires_grad=True) for heads in (H, kv_heads, kv_heads))
        out = attend(q, k, v)
        out.float().pow(2).sum().backward()
        results.append((out, q.grad, k.grad, v.grad))
    tolerance = FP32 if precision == "fp32" else BF16
    for got, want in zip(results[1], results[0]):
        assert torch.isfinite(got).all() and close(got, want, tolerance)
    if masking == "no key":
        assert torch.all(results[1][0][-1, :, 2] == 0) and torch.all(results[1][1][-1, :, 2] == 0)


def test_the_fast_path_off_the_cpu_uses_the_fused_kernel_unless_weights_are_asked(monkeypatch):
    """As on a GPU (``eager_on_cpu`` False): without need_weights, the fused kernel and no weights; with it,
    the grouped products and their weights. Both equal the reference module's output."""
    cfg = task_config("multi30k")
    args = (cfg.d_model, cfg.n_heads, 0.0, True, "sinusoidal", cfg.max_len)
    reference, fast = MultiHeadAttention(*args), FastMultiHeadAttention(*args)
    fast.load_state_dict(reference.state_dict())
    called = []
    monkeypatch.setattr(fast_attention, "eager_on_cpu", lambda x: False)
    monkeypatch.setattr(fast_attention, "fused_attention", lambda *a: called.append(1) or fused_attention(*a))
    x, mask = torch.randn(4, 11, cfg.d_model), target_mask(padded_ids(4, 11, 50), PAD)
    want, want_weights = reference(x, mask=mask, need_weights=True)
    got, weights = fast(x, mask=mask)
    assert called == [1] and weights is None and close(got, want, FP32)
    got, weights = fast(x, mask=mask, need_weights=True)
    assert called == [1] and close(got, want, FP32) and close(weights, want_weights, FP32)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("task", ["cumsum", "multi30k"])
def test_the_fused_loss_is_the_reference_loss(task, precision):
    """generator_nll against label_smoothed_nll of the generator's logits: the summed loss, and the gradients
    for the decoder's output, the output layer's weight and its bias."""
    _, vocab, batch, _, T = SHAPES[task]
    C = task_config(task).d_model
    generator = nn.Linear(C, vocab)
    hidden = torch.randn(batch, T, C, requires_grad=True)
    target = padded_ids(batch, T, vocab)
    tolerance = FP32 if precision == "fp32" else BF16
    results = []
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        for loss_of in (lambda: label_smoothed_nll(generator(hidden), target, PAD, 0.1),
                        lambda: generator_nll(hidden, generator, target, PAD, 0.1)):
            hidden.grad = generator.weight.grad = generator.bias.grad = None
            loss, n = loss_of()
            (loss / n).backward()
            results.append((loss / n, hidden.grad, generator.weight.grad, generator.bias.grad))
    for got, want in zip(results[1], results[0]):
        assert close(got, want, tolerance)


def test_byte_dropout_stands_in_for_nn_dropout():
    """speed_up swaps it in for nn.Dropout in place; nothing changes in eval mode, and in training the mean
    is nn.Dropout's."""
    model = speed_up(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1)))
    assert type(model[1]) is ByteDropout and model[1].p == 0.1
    x = torch.ones(400, 1000)
    assert torch.equal(model[1].eval()(x), x)
    assert model[1].train()(x).mean().item() == pytest.approx(nn.Dropout(0.1)(x).mean().item(), abs=0.01)


def test_byte_dropout_drops_at_its_rate_and_keeps_the_mean():
    layer = ByteDropout(0.1)
    x = torch.ones(400, 1000)
    y = layer(x)
    dropped = (y == 0).float().mean().item()
    assert dropped == pytest.approx(26 / 256, abs=0.003)  # 0.1 rounded to a multiple of 1/256
    assert y.mean().item() == pytest.approx(1.0, abs=0.01)  # kept values scaled by 256/230
    assert y.unique().tolist() == pytest.approx([0.0, 256 / 230])
    torch.manual_seed(3)
    a = layer(x)
    torch.manual_seed(3)
    assert torch.equal(a, layer(x))  # the global seed decides the mask: runs and resumes reproduce
    assert torch.equal(layer.eval()(x), x) and torch.equal(ByteDropout(0.0)(x), x)
    odd = torch.ones(30, 5, 7, requires_grad=True)  # a size that is not a multiple of 8
    layer.train()(odd).sum().backward()
    assert odd.grad.unique().tolist() == pytest.approx([0.0, 256 / 230])  # the mask's gradient
    for p, threshold in ((0.2, 51), (0.5, 128), (0.9, 230)):  # the bytes are uniform over all 256 values
        y = ByteDropout(p)(x)
        assert (y == 0).float().mean().item() == pytest.approx(threshold / 256, abs=0.004), p
    half = ByteDropout(0.5)(torch.ones(1000, 1000, dtype=torch.bfloat16))  # the mask is exact in bfloat16
    assert half.dtype == torch.bfloat16 and half.unique().tolist() == [0.0, 2.0]

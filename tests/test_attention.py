"""Attention: masks, the pure function, and parity with torch.nn.MultiheadAttention."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer.attention import MultiHeadAttention, attention
from transformer.positions import RotaryEmbedding, alibi_bias, alibi_slopes
from transformer.config import ModelConfig
from transformer.masks import causal_mask, padding_mask, target_mask
from transformer.model import build_model

PAD = 0


def copy_mha(ours: MultiHeadAttention, ref: nn.MultiheadAttention):
    """Load torch's (3C, C) in-projection and out-projection into ours. torch starts their biases at zero, where
    a bias dropped or taken from the wrong rows would change nothing: they are drawn at random first."""
    C = ref.embed_dim
    with torch.no_grad():
        ref.in_proj_bias.normal_(0.0, 0.5), ref.out_proj.bias.normal_(0.0, 0.5)
        if ours.fused_qkv:
            ours.qkv_proj.weight.copy_(ref.in_proj_weight)
            ours.qkv_proj.bias.copy_(ref.in_proj_bias)
        else:
            for i, proj in enumerate((ours.q_proj, ours.k_proj, ours.v_proj)):
                proj.weight.copy_(ref.in_proj_weight[i * C:(i + 1) * C])
                proj.bias.copy_(ref.in_proj_bias[i * C:(i + 1) * C])
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        ours.out_proj.bias.copy_(ref.out_proj.bias)


def tokens_with_padding(B=3, T=7, lengths=(7, 4, 2)):
    ids = torch.randint(1, 20, (B, T))
    for row, n in enumerate(lengths):
        ids[row, n:] = PAD
    return ids


def test_masks_shapes_and_values():
    ids = tokens_with_padding()
    assert padding_mask(ids, PAD).shape == (3, 1, 1, 7)
    assert causal_mask(5).shape == (1, 1, 5, 5)
    assert torch.equal(causal_mask(3)[0, 0], torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))
    mask = target_mask(ids, PAD)
    assert mask.shape == (3, 1, 7, 7)
    assert not mask[1, 0, 6, 4]  # a pad key
    assert not mask[0, 0, 2, 3]  # a future key
    assert mask[0, 0, 3, 2]


def test_weights_are_a_distribution_over_allowed_keys():
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = causal_mask(5)
    _, weights = attention(q, k, v, mask)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 5))
    assert torch.all(weights.masked_select(~mask.expand_as(weights)) == 0)


def test_a_mask_of_the_wrong_shape_or_kind_is_refused_naming_both_shapes():
    """A padding mask left as (B, Tk), without its head and query axes, broadcasts as (Tq, Tk) whenever B equals Tq:
    each query then reads the padding of one batch row, in every batch row, silently. It is refused, as are the
    source's mask given to the target's keys and an additive float mask."""
    q = torch.randn(4, 2, 4, 8)  # B = Tq = 4
    ids = tokens_with_padding(4, 4, (4, 3, 2, 1))
    with pytest.raises(ValueError, match=re.escape("mask of shape (4, 4) does not fit the scores' (B, H, Tq, Tk) = "
                                                   "(4, 2, 4, 4)")):
        attention(q, q, q, ids != PAD)
    right, _ = attention(q, q, q, padding_mask(ids, PAD))  # (B, 1, 1, Tk)
    broadcast, _ = attention(q, q, q, (ids != PAD)[None, None])  # what (4, 4) would have meant
    assert not torch.allclose(right, broadcast, atol=1e-3)
    with pytest.raises(ValueError, match=re.escape("(4, 1, 1, 6) does not fit")):
        attention(q, q, q, padding_mask(tokens_with_padding(4, 6, (6, 5, 4, 3)), PAD))
    with pytest.raises(TypeError, match="dtype torch.float32: it must be boolean, True where a query may attend"):
        attention(q, q, q, torch.zeros(1, 1, 4, 4))


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v = (torch.randn(1, 2, 3, 4, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    mask[..., 1, :] = False  # query 1 may attend to nothing
    out, weights = attention(q, k, v, mask)
    assert torch.all(weights[:, :, 1] == 0) and torch.all(out[:, :, 1] == 0)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_matches_torch(fused, causal):
    B, T, C, H = 3, 7, 32, 4
    ref = nn.MultiheadAttention(C, H, batch_first=True)
    ours = MultiHeadAttention(C, H, fused_qkv=fused)
    copy_mha(ours, ref)
    x = torch.randn(B, T, C)
    ids = tokens_with_padding(B, T)
    mask = target_mask(ids, PAD) if causal else padding_mask(ids, PAD)
    torch_causal = ~causal_mask(T)[0, 0] if causal else None  # torch: True = blocked
    expected, expected_w = ref(x, x, x, key_padding_mask=ids == PAD, attn_mask=torch_causal,
                               average_attn_weights=False)
    got, got_w = ours(x, mask=mask, need_weights=True)
    assert (got - expected).abs().max() <= 1e-5
    assert (got_w - expected_w).abs().max() <= 1e-5


@pytest.mark.parametrize("fused", [True, False])
def test_cross_attention_matches_torch(fused):
    B, T, S, C, H = 3, 5, 7, 32, 4
    ref = nn.MultiheadAttention(C, H, batch_first=True)
    ours = MultiHeadAttention(C, H, fused_qkv=fused)
    copy_mha(ours, ref)
    x, memory = torch.randn(B, T, C), torch.randn(B, S, C)
    src = tokens_with_padding(B, S)
    expected, _ = ref(x, memory, memory, key_padding_mask=src == PAD)
    got, weights = ours(x, memory, padding_mask(src, PAD), need_weights=True)
    assert weights.shape == (B, H, T, S)
    assert (got - expected).abs().max() <= 1e-5
    assert torch.all(weights[2, :, :, 2:] == 0)  # source padding gets no weight


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("masking", ["padding", "causal", "alibi"])
def test_grouped_query_attention_matches_torch(kv_heads, masking):
    """Key/value heads shared by groups of query heads, as torch's scaled_dot_product_attention with
    enable_gqa: query head h reads key/value head h // (H / Hkv)."""
    B, H, T, D = 3, 4, 7, 8
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, kv_heads, T, D), torch.randn(B, kv_heads, T, D)
    ids = tokens_with_padding(B, T)
    mask = {"padding": padding_mask(ids, PAD), "causal": causal_mask(T)}.get(masking, target_mask(ids, PAD))
    bias = alibi_bias(alibi_slopes(H), T, T) if masking == "alibi" else None
    got, weights = attention(q, k, v, mask, bias=bias)
    torch_mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf")) + (0 if bias is None else bias)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=torch_mask, enable_gqa=True)
    assert (got - expected).abs().max() <= 1e-5
    assert weights.shape == (B, H, T, T)


def repeated_heads(grouped: MultiHeadAttention) -> MultiHeadAttention:
    """The paper's attention that computes what ``grouped`` does: its key and value heads copied once
    for each query head that reads them."""
    H, Hkv, D = grouped.n_heads, grouped.n_kv_heads, grouped.head_dim
    C = H * D
    full = MultiHeadAttention(C, H, fused_qkv=grouped.fused_qkv)

    def repeat(rows: torch.Tensor) -> torch.Tensor:  # (Hkv * D, ...) -> (H * D, ...): head j to heads jG..jG+G-1
        return rows.unflatten(0, (Hkv, D)).repeat_interleave(H // Hkv, dim=0).flatten(0, 1)

    with torch.no_grad():
        if grouped.fused_qkv:
            for name in ("weight", "bias"):
                q, k, v = getattr(grouped.qkv_proj, name).split([C, Hkv * D, Hkv * D])
                getattr(full.qkv_proj, name).copy_(torch.cat([q, repeat(k), repeat(v)]))
        else:
            full.q_proj.load_state_dict(grouped.q_proj.state_dict())
            for name in ("k_proj", "v_proj"):
                for part in ("weight", "bias"):
                    getattr(getattr(full, name), part).copy_(repeat(getattr(getattr(grouped, name), part)))
        full.out_proj.load_state_dict(grouped.out_proj.state_dict())
    return full


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_query_attention_is_the_paper_attention_with_shared_key_value_heads(fused, kv_heads):
    """Self and cross attention, incremental decoding included: fewer key/value projections and a cache of
    Hkv heads, the outputs of full attention whose key and value heads come in copies."""
    B, T, S, C, H = 3, 6, 5, 32, 4
    grouped = MultiHeadAttention(C, H, fused_qkv=fused, n_kv_heads=kv_heads)
    full = repeated_heads(grouped)
    assert sum(p.numel() for p in grouped.parameters()) < sum(p.numel() for p in full.parameters())
    x, memory = torch.randn(B, T, C), torch.randn(B, S, C)
    ids, src = tokens_with_padding(B, T, (6, 4, 2)), tokens_with_padding(B, S, (5, 3, 1))
    for args in [(None, target_mask(ids, PAD)), (memory, padding_mask(src, PAD))]:
        got, got_w = grouped(x, *args, need_weights=True)
        expected, expected_w = full(x, *args, need_weights=True)
        assert (got - expected).abs().max() <= 1e-5 and (got_w - expected_w).abs().max() <= 1e-5
    cache, steps = {}, []
    for t in range(T):  # one token at a time, the earlier keys and values from the cache
        steps.append(grouped(x[:, t:t + 1], mask=causal_mask(1, start=t), cache=cache, start=t)[0])
    assert cache["k"].shape == cache["v"].shape == (B, kv_heads, T, C // H)
    assert (torch.cat(steps, 1) - full(x, mask=causal_mask(T))[0]).abs().max() <= 1e-5


@pytest.mark.parametrize("fused", [True, False])
def test_heads_of_any_width_are_eq_1_in_each_head_concatenated_and_projected_back(fused):
    """d_head apart from d_model / n_heads (the paper's d_k = d_v, Table 3's rows B): each head is eq. 1 on its
    own D-wide slice of the projections, and W^O maps the H * D concatenation back to C."""
    B, T, C, H, D = 2, 5, 32, 4, 12
    module = MultiHeadAttention(C, H, fused_qkv=fused, d_head=D)
    assert module.out_proj.weight.shape == (C, H * D)
    x = torch.randn(B, T, C)
    mask = target_mask(tokens_with_padding(B, T, (5, 3)), PAD)
    got, weights = module(x, mask=mask, need_weights=True)
    (wq, bq), (wk, bk), (wv, bv) = module.projections()
    assert wq.shape == wk.shape == wv.shape == (H * D, C)
    q, k, v = (F.linear(x, w, b).view(B, T, H, D) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    heads = []
    for h in range(H):
        scores = q[:, :, h] @ k[:, :, h].transpose(1, 2) / math.sqrt(D)  # (B, T, T)
        scores = scores.masked_fill(~mask[:, 0], float("-inf"))
        heads.append(scores.softmax(-1) @ v[:, :, h])  # (B, T, D)
    expected = module.out_proj(torch.cat(heads, -1))  # (B, T, C)
    assert (got - expected).abs().max() <= 1e-5 and weights.shape == (B, H, T, T)
    cache, steps = {}, []
    for t in range(T):  # incremental decoding keeps D-wide heads in its cache
        steps.append(module(x[:, t:t + 1], mask=causal_mask(1, start=t), cache=cache, start=t)[0])
    assert cache["k"].shape == (B, H, T, D)
    assert (torch.cat(steps, 1) - module(x, mask=causal_mask(T))[0]).abs().max() <= 1e-5


def test_d_head_of_d_model_over_n_heads_is_the_papers_model_and_a_bad_one_is_named():
    """d_head = C / H builds the default model, parameter for parameter; 0 or a width that the default would
    need to divide is refused or taken, naming the key."""
    base = dict(d_model=32, n_heads=4, encoder_layers=1, decoder_layers=1, d_ff=64, dropout=0.0, norm_first=False,
                tie_embeddings=True, fused_qkv=True, max_len=16)
    torch.manual_seed(0)
    default = build_model(ModelConfig(**base), "seq2seq", 20, 20, True)
    torch.manual_seed(0)
    explicit = build_model(ModelConfig(**base, d_head=8), "seq2seq", 20, 20, True)
    assert all(torch.equal(a, b) for a, b in zip(default.state_dict().values(), explicit.state_dict().values()))
    with pytest.raises(ValueError, match="d_head: must be > 0"):
        ModelConfig(**base, d_head=0)
    odd = ModelConfig(**{**base, "d_model": 30}, d_head=10)  # 30 / 4 heads is no width; 10 each is
    src, tgt = tokens_with_padding(1, 3, (3,)), tokens_with_padding(1, 2, (2,))
    logits = build_model(odd, "seq2seq", 20, 20, True)(src, tgt, padding_mask(src, PAD), target_mask(tgt, PAD))
    assert odd.head_dim == 10 and logits.shape == (1, 2, 20)


def test_rope_scores_depend_only_on_the_offset():
    rope = RotaryEmbedding(head_dim=8, max_len=64)
    q, k = torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
    positions = torch.arange(10)
    scores = rope(q, positions) @ rope(k, positions).transpose(-2, -1)
    for shift in (1, 7, 30):
        shifted = rope(q, positions + shift) @ rope(k, positions + shift).transpose(-2, -1)
        assert torch.allclose(scores, shifted, atol=1e-4)
    assert not torch.allclose(scores, q @ k.transpose(-2, -1), atol=1e-3)  # it does rotate
    assert torch.allclose(rope(q, positions).norm(dim=-1), q.norm(dim=-1), atol=1e-5)  # a rotation


@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_rope_turns_pair_i_by_position_times_base_power(base):
    """model.rope_base reaches every attention's RoPE: feature pair i of a head turns by p * base^(-2i/D)."""
    cfg = ModelConfig(d_model=32, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=32, dropout=0.0,
                      norm_first=False, tie_embeddings=True, fused_qkv=True, max_len=40, positional="rope",
                      rope_base=base)
    model = build_model(cfg, "seq2seq", 11, 11, joint_vocab=True)
    rotaries = [m.rotary for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(rotaries) == 3  # encoder self, decoder self, cross
    D, p = 16, 23
    for i in (0, 1, 5):
        unit = torch.zeros(1, 1, 1, D)
        unit[..., 2 * i] = 1.0  # the first feature of pair i
        angle = p * base ** (-2 * i / D)
        for rotary in rotaries:
            turned = rotary(unit, torch.tensor([p]))[0, 0, 0]
            assert turned[2 * i].item() == pytest.approx(math.cos(angle), abs=1e-5)
            assert turned[2 * i + 1].item() == pytest.approx(math.sin(angle), abs=1e-5)


def test_alibi_matches_its_closed_form():
    slopes = alibi_slopes(8)
    assert torch.allclose(slopes, torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    assert torch.allclose(alibi_slopes(4), torch.tensor([2.0 ** -(2 * (i + 1)) for i in range(4)]))
    six = alibi_slopes(6)  # not a power of two: 4 of H=4, then every other one of H=8
    assert torch.allclose(six, torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]))
    bias = alibi_bias(slopes, 5, 7)
    assert bias.shape == (1, 8, 5, 7)
    for h, i, j in [(0, 0, 0), (0, 4, 1), (3, 2, 6), (7, 1, 0)]:
        assert bias[0, h, i, j] == pytest.approx(-slopes[h].item() * abs(i - j))

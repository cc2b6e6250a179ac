"""The model: parity with torch's layers and whole stacks, causality, padding invariance, positions, overfitting."""

import functools

import pytest
import torch
from torch import nn

from transformer.masks import causal_mask, padding_mask, target_mask
from lib.model.setup import repeats_input
from lib.train.families import TRAINING
from transformer.layers import DecoderLayer, EncoderLayer, FeedForward, RMSNorm
from transformer.model import Transformer, TransformerLM, build_model, parameter_counts
from transformer.positions import SinusoidalPositionalEncoding
from transformer.loss import label_smoothed_nll
from lib.data.tokenizer import SpecialIds
from tests.conftest import model_config, torch_compile_defaults
from tests.test_attention import PAD, copy_mha, tokens_with_padding


def copy_common(ours, ref, norms):
    with torch.no_grad():
        for mine, theirs in [(ours.feed_forward.linear1, ref.linear1), (ours.feed_forward.linear2, ref.linear2),
                             *[(getattr(ours, n), getattr(ref, n)) for n in norms]]:
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)


def copy_layers(ours: nn.ModuleList, ref: nn.ModuleList):
    """Load each of torch's encoder or decoder layers into ours, layer by layer."""
    for mine, theirs in zip(ours, ref, strict=True):
        copy_mha(mine.self_attn, theirs.self_attn)
        if hasattr(theirs, "multihead_attn"):
            copy_mha(mine.cross_attn, theirs.multihead_attn)
        copy_common(mine, theirs, [n for n in ("norm1", "norm2", "norm3") if hasattr(theirs, n)])


def final_norm(ours: nn.Module, ref: nn.LayerNorm, norm_first: bool) -> nn.LayerNorm | None:
    """torch's stacks end in a LayerNorm whatever norm_first says. The paper's Post-LN has none; Pre-LN needs one.
    The norm the reference should end in, its weights loaded into ours."""
    if not norm_first:
        return None
    with torch.no_grad():
        ours.weight.copy_(ref.weight), ours.bias.copy_(ref.bias)
    return ref


def with_trained_looking_norms(model: nn.Module) -> nn.Module:
    """Norm gains and biases away from 1 and 0, as training leaves them: a fresh LayerNorm after a fresh LayerNorm
    changes nothing, so only then does an extra or a missing norm show."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5), module.bias.normal_(0.0, 0.2)
    return model


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("fused, activation", [(True, "relu"), (False, "relu"), (True, "gelu")])
def test_encoder_layer_matches_torch(norm_first, fused, activation):
    cfg = model_config(norm_first=norm_first, fused_qkv=fused, activation=activation)
    ref = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0, batch_first=True,
                                     norm_first=norm_first, activation=activation)
    ours = EncoderLayer(cfg)
    copy_layers([ours], [with_trained_looking_norms(ref)])
    ref.train(), ours.train()  # dropout is 0; train mode keeps torch off its fused fast path
    x = torch.randn(3, 7, cfg.d_model)
    ids = tokens_with_padding()
    expected = ref(x, src_key_padding_mask=ids == PAD)
    got, _ = ours(x, padding_mask(ids, PAD))
    assert (got - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("fused, activation", [(True, "relu"), (False, "relu"), (True, "gelu")])
def test_decoder_layer_matches_torch(norm_first, fused, activation):
    cfg = model_config(norm_first=norm_first, fused_qkv=fused, activation=activation)
    ref = nn.TransformerDecoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0, batch_first=True,
                                     norm_first=norm_first, activation=activation)
    ours = DecoderLayer(cfg)
    copy_layers([ours], [with_trained_looking_norms(ref)])
    x, memory = torch.randn(3, 7, cfg.d_model), torch.randn(3, 5, cfg.d_model)
    tgt, src = tokens_with_padding(3, 7), tokens_with_padding(3, 5, (5, 3, 1))
    expected = ref(x, memory, tgt_mask=~causal_mask(7)[0, 0],
                   tgt_key_padding_mask=tgt == PAD, memory_key_padding_mask=src == PAD, tgt_is_causal=True)
    got, self_w, cross_w = ours(x, memory, target_mask(tgt, PAD), padding_mask(src, PAD), need_weights=True)
    assert (got - expected).abs().max() <= 1e-5
    assert torch.all(self_w.triu(1) == 0)  # nothing from the future
    assert torch.all(cross_w[2, :, :, 1:] == 0)  # nothing from source padding


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")  # torch's constructor, on Pre-LN
@pytest.mark.parametrize("norm_first", [False, True])
def test_the_whole_encoder_decoder_matches_torch_transformer(norm_first):
    """The stacks as the layers are stacked: 3 encoder layers then 2 decoder layers, each decoder layer reading the
    last encoder layer's output (after the final norm), the masks carried through every layer, equal to
    ``torch.nn.Transformer`` given our embeddings."""
    cfg = model_config(norm_first=norm_first, encoder_layers=3, decoder_layers=2)
    ours = Transformer(cfg, 30, 30, joint_vocab=True).eval()
    ref = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.encoder_layers, cfg.decoder_layers, cfg.d_ff, dropout=0.0,
                         batch_first=True, norm_first=norm_first).train()  # train: off torch's fused fast path
    with_trained_looking_norms(ref)
    copy_layers(ours.encoder_layers, ref.encoder.layers)
    copy_layers(ours.decoder_layers, ref.decoder.layers)
    ref.encoder.norm = final_norm(ours.encoder_norm, ref.encoder.norm, norm_first)
    ref.decoder.norm = final_norm(ours.decoder_norm, ref.decoder.norm, norm_first)
    src, tgt = tokens_with_padding(3, 6, (6, 4, 2)), tokens_with_padding(3, 7)
    expected = ref(ours.src_embed(src), ours.tgt_embed(tgt), tgt_mask=~causal_mask(7)[0, 0], tgt_is_causal=True,
                   src_key_padding_mask=src == PAD, tgt_key_padding_mask=tgt == PAD,
                   memory_key_padding_mask=src == PAD)
    got = ours(src, tgt, padding_mask(src, PAD), target_mask(tgt, PAD), project=False)
    assert (got - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_whole_lm_matches_torchs_encoder_stack_under_a_causal_mask(norm_first):
    """The decoder-only LM is torch's ``TransformerEncoder`` under a causal mask, given our embeddings, then our
    output layer."""
    cfg = model_config(norm_first=norm_first, decoder_layers=3)
    ours = TransformerLM(cfg, 30).eval()
    layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0, batch_first=True,
                                       norm_first=norm_first)
    ref = nn.TransformerEncoder(layer, cfg.decoder_layers, norm=nn.LayerNorm(cfg.d_model), enable_nested_tensor=False)
    with_trained_looking_norms(ref.train())
    copy_layers(ours.layers, ref.layers)
    ref.norm = final_norm(ours.norm, ref.norm, norm_first)
    ids = torch.randint(0, 30, (3, 9))
    expected = ours.generator(ref(ours.embed(ids), mask=~causal_mask(9)[0, 0], is_causal=True))
    assert (ours(ids) - expected).abs().max() <= 1e-5


def test_rmsnorm_matches_torch():
    ours, ref = RMSNorm(16), nn.RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ref.weight.copy_(ours.weight)
    x = 3 * torch.randn(2, 5, 16) + 1
    assert (ours(x) - ref(x)).abs().max() <= 1e-5
    assert not torch.allclose(ours(x), nn.LayerNorm(16)(x), atol=1e-2)  # no centring: not LayerNorm
    with torch.autocast("cpu", torch.bfloat16):  # computed in float32, returned in the input's dtype
        assert ours(x.bfloat16()).dtype == torch.bfloat16


def test_swiglu_is_swish_of_one_projection_times_the_other():
    ff = FeedForward(8, 12, dropout=0.0, activation="swiglu")
    assert ff.linear1.weight.shape == (24, 8) and ff.linear2.weight.shape == (8, 12)
    W1, W3 = ff.linear1.weight[:12], ff.linear1.weight[12:]
    b1, b3 = ff.linear1.bias[:12], ff.linear1.bias[12:]
    x = torch.randn(2, 3, 8)
    a = x @ W1.T + b1
    expected = (a * torch.sigmoid(a) * (x @ W3.T + b3)) @ ff.linear2.weight.T + ff.linear2.bias
    assert (ff(x) - expected).abs().max() <= 1e-6


POSITIONALS = ["sinusoidal", "learned", "rope", "alibi"]


def seq2seq(**overrides):
    return Transformer(model_config(**overrides), 30, 30, joint_vocab=True).eval()


def logits(model, src, tgt):
    return model(src, tgt, padding_mask(src, PAD), target_mask(tgt, PAD))


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_is_causal(norm_first, positional):
    model = seq2seq(norm_first=norm_first, positional=positional)
    src, tgt = torch.randint(1, 30, (2, 6)), torch.randint(1, 30, (2, 8))
    before = logits(model, src, tgt)
    for t in range(7):
        changed = tgt.clone()
        changed[:, t + 1] = (changed[:, t + 1] % 29) + 1  # another real token
        after = logits(model, src, changed)
        assert torch.allclose(before[:, : t + 1], after[:, : t + 1], atol=1e-6)
        assert not torch.allclose(before[:, t + 1:], after[:, t + 1:], atol=1e-6)


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("modern", [False, True])
def test_lm_is_causal(positional, modern):
    """``modern``: Llama's choices, grouped-query attention, RMSNorm and SwiGLU."""
    extra = dict(n_kv_heads=2, norm="rmsnorm", activation="swiglu", norm_first=True) if modern else {}
    model = TransformerLM(model_config(positional=positional, **extra), 30).eval()
    ids = torch.randint(0, 30, (2, 10))
    before = model(ids)
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 30
    after = model(changed)
    assert torch.allclose(before[:, :6], after[:, :6], atol=1e-6)
    assert not torch.allclose(before[:, 6:], after[:, 6:], atol=1e-6)


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("norm_first", [False, True])
def test_padding_does_not_change_real_positions(norm_first, positional):
    model = seq2seq(norm_first=norm_first, positional=positional)
    src, tgt = torch.randint(1, 30, (2, 5)), torch.randint(1, 30, (2, 6))
    padded_src = torch.cat([src, torch.full((2, 4), PAD)], dim=1)
    padded_tgt = torch.cat([tgt, torch.full((2, 3), PAD)], dim=1)
    plain = logits(model, src, tgt)
    padded = logits(model, padded_src, padded_tgt)
    assert (padded[:, :6] - plain).abs().max() <= 1e-5


def test_positional_encoding_values():
    pe = SinusoidalPositionalEncoding(8, max_len=10)
    assert torch.allclose(pe.table[0], torch.tensor([0.0, 1.0] * 4))
    assert torch.isclose(pe.table[3, 2], torch.sin(torch.tensor(3.0) / 10000 ** (2 / 8)))


@pytest.mark.parametrize("positional", POSITIONALS)
def test_longer_input_than_max_len_is_a_clear_error(positional):
    model = TransformerLM(model_config(positional=positional, max_len=10), 30)
    with pytest.raises(ValueError, match="sequence length 11 exceeds model.max_len 10"):
        model(torch.zeros(1, 11, dtype=torch.long))


def test_an_id_outside_the_vocabulary_is_named_by_its_argument_row_and_position():
    """nn.Embedding says only "index out of range in self"; the model names the input (src, tgt, the LM's ids), the
    id, and where it is: its row and its position in the sequence (after the cache's ``start`` tokens)."""
    model, ids = seq2seq(), torch.randint(1, 30, (2, 6))
    too_big, negative = ids.clone(), ids.clone()
    too_big[1, 4], negative[0, 2] = 30, -1
    with pytest.raises(IndexError, match=r"^src: token id 30 at row 1, position 4 is outside the vocabulary "
                                         r"\(ids 0 to 29\)$"):
        logits(model, too_big, ids)
    with pytest.raises(IndexError, match=r"^tgt: token id -1 at row 0, position 2 is outside"):
        logits(model, ids, negative)
    with pytest.raises(IndexError, match=r"^tgt: token id 30 at row 0, position 7 is outside"):
        model.decode(torch.tensor([[30], [29]]), model.encode(ids, None)[0], None, None, model.new_cache(), start=7)
    lm = TransformerLM(model_config(), 30)
    with pytest.raises(IndexError, match=r"^ids: token id 30 at row 1, position 4 is outside .* \(ids 0 to 29\)$"):
        lm(too_big)
    assert lm(torch.tensor([[0, 29]])).shape == (1, 2, 30)  # both ends of the vocabulary are ids


def test_weight_tying():
    model = Transformer(model_config(tie_embeddings=True), 30, 30, joint_vocab=True)
    assert model.generator.weight is model.tgt_embed.tokens.weight is model.src_embed.tokens.weight
    separate = Transformer(model_config(tie_embeddings=True), 40, 30, joint_vocab=False)
    assert separate.generator.weight is separate.tgt_embed.tokens.weight
    assert separate.src_embed.tokens.weight is not separate.tgt_embed.tokens.weight
    lm = build_model(model_config(tie_embeddings=True), "lm", 30, 30, joint_vocab=True)
    assert lm.generator.weight is lm.embed.tokens.weight


@pytest.mark.parametrize("kind, joint, tie, positional, bias, modern", [
    ("seq2seq", True, True, "sinusoidal", True, False), ("seq2seq", True, False, "learned", True, False),
    ("seq2seq", False, True, "rope", False, False), ("lm", True, True, "alibi", True, False),
    ("lm", True, False, "learned", False, False), ("seq2seq", True, True, "sinusoidal", True, True),
    ("lm", True, True, "rope", False, True),
])
def test_parameter_counts_are_the_closed_form_and_count_a_tied_matrix_once(kind, joint, tie, positional, bias,
                                                                           modern):
    """``modern``: 2 key/value heads of 4 (K = 16 wide, not C), RMSNorm (a gain, never a bias) and SwiGLU."""
    C, F, L, V, S = 32, 64, 64, 30, 40  # width, feed-forward, max_len, target and source vocabularies
    extra = dict(n_kv_heads=2, norm="rmsnorm", activation="swiglu") if modern else {}
    cfg = model_config(tie_embeddings=tie, positional=positional, bias=bias, norm_first=True, **extra)
    model = build_model(cfg, kind, S if not joint else V, V, joint_vocab=joint)
    counts = parameter_counts(model)
    assert counts["total"] == sum(p.numel() for p in model.parameters())  # torch's count, shared tensors once
    assert counts["total"] == sum(n for part, n in counts.items() if part != "total")

    K = 16 if modern else C  # the keys' and the values' width
    attention = 2 * C * C + 2 * C * K + bias * (2 * C + 2 * K)
    feed_forward = (3 if modern else 2) * C * F + bias * ((2 if modern else 1) * F + C)
    norm = C + (bias and not modern) * C
    if kind == "lm":  # one self-attention a layer, the final LayerNorm of Pre-LN
        layers = {"attention": 2 * attention, "feed-forward": 2 * feed_forward, "norms": (2 * 2 + 1) * norm}
        tables, untied = V * C, V * C
        positions = L * C
    else:  # the decoder's layers attend twice and normalise three times; a final LayerNorm per stack
        layers = {"attention": 3 * 2 * attention, "feed-forward": 4 * feed_forward,
                  "norms": (2 * 2 + 2 * 3 + 2) * norm}
        tables = V * C if joint else (S + V) * C  # one vocabulary: one table for both sides, if tied
        untied = 2 * V * C if joint else (S + V) * C
        positions = 2 * L * C
    assert counts["embeddings"] == (tables if tie else untied)
    assert counts.get("positions", 0) == (positions if positional == "learned" else 0)  # none: left out
    assert {part: counts[part] for part in layers} == layers
    assert counts.get("output layer", 0) == (0 if tie else V * C) + bias * V


@pytest.mark.parametrize("norm_first", [True, False])
def test_an_untrained_lm_predicts_every_token_about_alike(norm_first):
    """Its first loss is near ln V, what knowing nothing scores, rather than far above it: no position starts
    out predicting its own input token (which Xavier-sized token vectors under sqrt(d_model) did: 11 nats)."""
    import math

    import torch.nn.functional as F

    torch.manual_seed(0)
    V = 69  # shakespeare's characters and the special tokens
    lm = TransformerLM(model_config(d_model=192, n_heads=6, d_ff=768, decoder_layers=4, encoder_layers=0,
                                    norm_first=norm_first, tie_embeddings=True, max_len=128), V).eval()
    ids = torch.randint(4, V, (8, 128))
    with torch.no_grad():
        logits = lm(ids)  # (B, T, V)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1)).item()
    assert abs(loss - math.log(V)) < 0.3
    assert (logits.argmax(-1) == ids).float().mean() < 0.9


def test_a_tied_decoder_with_a_small_vocabulary_starts_out_repeating_its_input():
    """cumsum modulo 10's model (14 tokens, width 64): tied, its Xavier-sized input vectors, which are also the
    output layer's rows, outweigh the rest of the residual stream; untied, or with the LM's small vectors,
    the untrained model repeats its input about as often as chance (1 in 10). Measuring leaves the model's
    mode and the random-number state as they were, so training from it is unchanged."""
    cfg = dict(d_model=64, d_ff=128, max_len=64, dropout=0.1)
    shares = {}
    for tied in (True, False):
        shares[tied] = []
        for seed in range(4):
            torch.manual_seed(seed)
            model = build_model(model_config(**cfg, tie_embeddings=tied), "seq2seq", 14, 14, joint_vocab=True)
            state = torch.get_rng_state()
            shares[tied].append(repeats_input(model, SpecialIds(0, 1, 2, 3), TRAINING["seq2seq"].logits))
            assert torch.equal(torch.get_rng_state(), state) and model.training
    assert min(shares[True]) > 0.6 and max(shares[False]) < 0.3
    lm = build_model(model_config(**cfg, tie_embeddings=True, encoder_layers=0), "lm", 14, 14, joint_vocab=True)
    assert repeats_input(lm, SpecialIds(0, 1, 2, 3), TRAINING["lm"].logits) < 0.3


def test_overfits_one_batch():
    model = build_model(model_config(), "seq2seq", 30, 30, joint_vocab=True).train()
    src = torch.randint(4, 30, (8, 6))
    tgt_in = torch.cat([torch.full((8, 1), 1), src.flip(1)], dim=1)  # bos + reversed source
    tgt_out = torch.cat([src.flip(1), torch.full((8, 1), 2)], dim=1)  # reversed source + eos
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss, n = label_smoothed_nll(logits(model, src, tgt_in), tgt_out, PAD, 0.0)
        (loss / n).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert (loss / n).item() < 0.05
    assert torch.equal(logits(model.eval(), src, tgt_in).argmax(-1), tgt_out)


def test_bias_free_model_equals_the_biased_one_with_zero_biases():
    """``bias: false`` drops every linear and LayerNorm bias (nanoGPT's choice) and changes nothing else."""
    for kind in ("seq2seq", "lm"):
        free = build_model(model_config(bias=False), kind, 30, 30, joint_vocab=True).eval()
        biased = build_model(model_config(), kind, 30, 30, joint_vocab=True).eval()
        assert not [n for n, _ in free.named_parameters() if n.endswith("bias")]
        biases = {n for n, _ in biased.named_parameters() if n.endswith("bias")}
        with torch.no_grad():
            for name, p in biased.named_parameters():
                p.copy_(torch.zeros_like(p) if name in biases else free.get_parameter(name))
        src, tgt = torch.randint(1, 30, (2, 5)), torch.randint(1, 30, (2, 6))
        if kind == "lm":
            assert torch.allclose(free(tgt), biased(tgt), atol=1e-6)
        else:  # cross attention too, through the fused projection's key/value rows
            assert torch.allclose(logits(free, src, tgt), logits(biased, src, tgt), atol=1e-6)


def test_bias_free_lm_is_causal_and_learns():
    model = TransformerLM(model_config(bias=False, norm_first=True), 30).train()
    ids = torch.randint(0, 30, (4, 12))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).reshape(-1, 30), ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.item() < 1.0
    model.eval()
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 30
    assert torch.allclose(model(ids)[:, :6], model(changed)[:, :6], atol=1e-6)


@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
@pytest.mark.parametrize("modern", [False, True])
def test_training_flops_counts_the_matmuls_a_training_step_runs(kind, modern):
    """MFU's numerator against PyTorch's own FLOP counter, on a batch without padding (padding is not counted);
    ``modern``: with one key/value head and SwiGLU."""
    from torch.utils.flop_counter import FlopCounterMode

    from lib.data.pairs import Batch
    from lib.model.hardware import training_flops
    from lib.model.losses import lm_loss, seq2seq_loss
    from tests.test_decoding import IDS

    extra = dict(n_kv_heads=1, activation="swiglu") if modern else {}
    cfg, V, B, S, T = model_config(d_ff=48, **extra), 50, 3, 7, 5
    tokens = lambda n: torch.randint(4, V, (B, n))  # noqa: E731 - a one-line helper, named where it is used
    with FlopCounterMode(display=False) as counter:
        if kind == "seq2seq":
            model = Transformer(cfg, V, V, joint_vocab=True)
            loss, _ = seq2seq_loss(model, Batch(tokens(S), tokens(T), tokens(T), B * T), IDS, 0.1)
            expected = training_flops(cfg, V, [S] * B, [T] * B)
        else:
            model = TransformerLM(cfg, V)
            loss = lm_loss(model, tokens(T), tokens(T))
            expected = training_flops(cfg, V, [], [T] * B)
        loss.backward()
    assert counter.get_total_flops() == expected


def test_a_peak_on_a_slow_kernel_is_timed_on_small_products(monkeypatch):
    """bfloat16 on a CPU without AVX-512 multiplies at ~1 GFLOP/s: the 2048 products that reach a real
    kernel's peak would take minutes there (gpu_check's dry run ran past its 300 s on such a CPU)."""
    from lib.model import hardware

    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    assert hardware.square_sizes(cpu, bf16, {"avx", "avx2", "fma"}) == (256,)
    assert hardware.square_sizes(cpu, bf16, {"avx2", "avx512f"}) == (1024, 2048)  # 0.8x float32's rate
    assert hardware.square_sizes(cpu, bf16, {"avx2", "amx_bf16"}) == (1024, 2048)
    assert hardware.square_sizes(cpu, bf16, set()) == (1024, 2048)  # not x86 Linux: nothing known
    assert hardware.square_sizes(cpu, torch.float32, {"avx2"}) == (1024, 2048)
    assert hardware.square_sizes(torch.device("cuda"), bf16) == (4096, 8192)

    def avx2(a, b, products=1):  # bfloat16 on an AVX2 CPU: a @ b slowest, a @ b.T and a.T @ b faster
        sizes.append(a.size(0))
        return 20e9 if not a.is_contiguous() else 12e9 if not b.is_contiguous() else 1.3e9

    sizes = []
    monkeypatch.setattr(hardware, "product_rate", avx2)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2"})
    assert hardware.matmul_peak(bf16, cpu) == 20e9 and set(sizes) == {256}  # the fastest layout, small products


def training_models(device: str, **overrides):
    """A seq2seq model and an LM (the test config with dropout 0.1 and ``overrides``) in training mode on
    ``device``, with their inputs: padded sources (6, S) and targets (6, 10) without padding."""
    from tests.test_decoding import V, sources

    cfg = model_config(dropout=0.1, **overrides)
    seq2seq = build_model(cfg, "seq2seq", V, V, joint_vocab=True, fast=True).to(device).train()
    lm = build_model(cfg, "lm", V, V, joint_vocab=True, fast=True).to(device).train()
    return seq2seq, lm, sources().to(device), torch.randint(4, V, (6, 10), device=device)


def both_forward_passes(device: str):
    """``training_models``: returns a function that runs both forward passes and gives their logits, (6, 10, V)
    each. Shared by the meta-device test here and the CUDA sync test, which checks only the call."""
    from tests.test_decoding import IDS

    seq2seq, lm, src, tgt = training_models(device)
    return lambda: (seq2seq(src, tgt, padding_mask(src, IDS.pad), target_mask(tgt, IDS.pad)), lm(tgt))


def test_the_forward_pass_reads_nothing_back_from_an_accelerator():
    """On the meta device (shapes, no data) any read of a value back to Python raises: a forward
    pass that runs there has no branch on tensor values, each of which would stall a GPU's host
    thread until the device caught up. (A CPU takes such a branch in attention on purpose.)"""
    from tests.test_decoding import V

    seq2seq_logits, lm_logits = both_forward_passes("meta")()
    assert seq2seq_logits.shape == (6, 10, V)
    assert lm_logits.shape == (6, 10, V)


def training_losses(device: str, **overrides):
    """The train stage's two losses, ``seq2seq_loss`` and ``lm_loss``, of ``training_models``: returns a function
    that gives both. Shared by the meta-device test here and the CUDA sync test."""
    from lib.data.pairs import Batch
    from lib.model.losses import lm_loss, seq2seq_loss
    from tests.test_decoding import IDS

    seq2seq, lm, src, tgt = training_models(device, **overrides)

    def losses():
        loss, n = seq2seq_loss(seq2seq, Batch(src, tgt, tgt, tgt.numel()), IDS, 0.1)
        return loss / n, lm_loss(lm, tgt, tgt)
    return losses


MODERN = dict(n_kv_heads=1, activation="swiglu", norm="rmsnorm", norm_first=True)


@pytest.mark.parametrize("modern", [False, True])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "alibi"])
def test_a_training_step_reads_nothing_back_from_an_accelerator(positional, modern):
    """The train stage's losses and their backward pass, on the meta device: its one read of a step is
    the logged loss (``read_back``). The loss counting its targets on the device waited for the whole
    forward pass on a GPU at every batch; ALiBi made its distances on the CPU, which a model on a GPU
    could not add to its scores (and a CPU tensor here cannot meet a meta one either)."""
    seq2seq_loss, lm_loss = training_losses("meta", positional=positional, **(MODERN if modern else {}))()
    (seq2seq_loss + lm_loss).backward()
    assert seq2seq_loss.shape == lm_loss.shape == ()


@pytest.mark.slow  # torch.compile
def test_the_training_forward_pass_compiles_into_one_graph():
    """Under torch.compile (train.compile) dropout and attention's fully-masked-row pass take their
    traceable forms on a CPU too, so the training forward pass is one graph there as on a GPU:
    a graph break would cost a return to Python and the fusions across it."""
    explanation = torch._dynamo.explain(both_forward_passes("cpu"))()
    assert explanation.graph_break_count == 0, [b.reason for b in explanation.break_reasons]
    assert explanation.graph_count == 1


@pytest.mark.slow  # torch.compile
def test_a_compiled_seq2seq_serves_every_batch_shape_with_one_graph(monkeypatch):
    """lib.train.training.compile_model: batches with S == T, then S != T, then another batch size, all
    through the first graph; by default the first batch's S == T would be assumed from then on."""
    from torch._dynamo.testing import CompileCounter

    from transformer.fast.compile import compile_model
    from tests.test_decoding import V

    counter = CompileCounter()  # counts the graphs dynamo captures, compiles none
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=counter))
    torch._dynamo.reset()
    with torch_compile_defaults(), torch.no_grad():
        model = build_model(model_config(dropout=0.1), "seq2seq", V, V, True, fast=True).train()
        model = compile_model(model, "seq2seq")
        for B, S, T in [(3, 5, 5), (3, 7, 9), (4, 6, 2)]:
            src, tgt = torch.randint(4, V, (B, S)), torch.randint(4, V, (B, T))
            assert model(src, tgt, padding_mask(src, PAD), target_mask(tgt, PAD)).shape == (B, T, V)
    assert counter.frame_count == 1

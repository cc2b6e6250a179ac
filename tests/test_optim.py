"""The Noam and cosine schedules, label smoothing, and the fused loss against it in float64."""

import pytest
import torch
import torch.nn.functional as F

from transformer.fast import loss as optim
from transformer.fast.loss import generator_nll
from transformer.loss import label_smoothed_nll, smoothed_targets
from transformer.schedules import noam_lr

PAD = 0


def test_noam_rises_linearly_peaks_at_warmup_then_decays():
    lrs = [noam_lr(step, d_model=512, warmup=4000, factor=1.0) for step in range(1, 20001)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == 4000
    assert lrs[3999] == pytest.approx(512**-0.5 * 4000**-0.5)
    assert lrs[1] == pytest.approx(2 * lrs[0])  # linear warmup
    assert lrs[15999] == pytest.approx(lrs[3999] / 2)  # 1/sqrt(step): 4x the steps, half the rate
    assert noam_lr(100, 512, 4000, factor=2.0) == pytest.approx(2 * noam_lr(100, 512, 4000, 1.0))


def test_without_smoothing_it_is_cross_entropy():
    logits, target = torch.randn(4, 6, 11), torch.randint(1, 11, (4, 6))
    loss, n = label_smoothed_nll(logits, target, PAD, 0.0)
    expected = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), reduction="sum")
    assert n == 24 and loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_pad_targets_add_nothing():
    logits, target = torch.randn(2, 5, 11), torch.randint(1, 11, (2, 5))
    padded = target.clone()
    padded[:, 3:] = PAD
    full, _ = label_smoothed_nll(logits[:, :3], target[:, :3], PAD, 0.1)
    masked, n = label_smoothed_nll(logits, padded, PAD, 0.1)
    assert n == 6 and masked.item() == pytest.approx(full.item(), rel=1e-6)


def test_smoothed_target_sums_to_one_with_no_mass_on_pad():
    target = torch.tensor([3, PAD, 7])
    dist = smoothed_targets(target, vocab_size=10, pad_id=PAD, smoothing=0.2)
    assert torch.allclose(dist[[0, 2]].sum(1), torch.ones(2))
    assert torch.all(dist[:, PAD] == 0) and torch.all(dist[1] == 0)
    assert dist[0, 3] == pytest.approx(0.8) and dist[0, 5] == pytest.approx(0.2 / 8)


def test_loss_is_cross_entropy_against_the_smoothed_target():
    logits, target = torch.randn(12, 10), torch.randint(0, 10, (12,))
    dist = smoothed_targets(target, 10, PAD, 0.1)
    expected = -(dist * F.log_softmax(logits, -1)).sum()
    loss, _ = label_smoothed_nll(logits, target, PAD, 0.1)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_loss_and_its_gradient_are_those_of_the_smoothed_cross_entropy(smoothing):
    logits = torch.randn(3, 7, 13, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 13, (3, 7))
    target[0, 4:] = PAD
    loss, _ = label_smoothed_nll(logits, target, PAD, smoothing)
    (2.5 * loss).backward()
    reference = logits.detach().clone().requires_grad_()
    dist = smoothed_targets(target, 13, PAD, smoothing).double()
    (2.5 * -(dist * F.log_softmax(reference.reshape(-1, 13), -1)).sum()).backward()
    assert torch.allclose(logits.grad, reference.grad, atol=1e-12)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("rows", [4, 7, 100])
def test_generator_nll_equals_the_loss_of_the_full_logits(smoothing, rows):
    """The chunked output layer + loss: same value and same gradients for hidden, weight and bias."""
    torch.manual_seed(0)
    generator = torch.nn.Linear(5, 13).double()
    hidden = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 13, (3, 7))
    target[0, 4:] = PAD
    loss, n = generator_nll(hidden, generator, target, PAD, smoothing, rows=rows)
    (2.5 * loss).backward()
    grads = [hidden.grad, generator.weight.grad, generator.bias.grad]
    hidden.grad = generator.weight.grad = generator.bias.grad = None
    expected, n_expected = label_smoothed_nll(generator(hidden), target, PAD, smoothing)
    (2.5 * expected).backward()
    assert n == n_expected == 21 - 3
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    for got, want in zip(grads, [hidden.grad, generator.weight.grad, generator.bias.grad]):
        assert torch.allclose(got, want, atol=1e-12)
    with torch.no_grad():  # evaluation: the loss alone
        assert generator_nll(hidden, generator, target, PAD, smoothing, rows)[0].item() == pytest.approx(loss.item())


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("given", [False, True])
def test_generator_nll_puts_no_padding_row_through_the_output_layer(compiled, given, monkeypatch):
    """Only the real targets' rows reach the output layer's blocks, in their order: a padding row's loss and
    gradient are zero, its product with the weight work for nothing. Its gradient comes back zero, the real
    rows' as the full logits give it; the same with the count given (as a Batch's n_tokens) or counted."""
    torch.manual_seed(0)
    generator = torch.nn.Linear(5, 13).double()
    hidden = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 13, (3, 7))
    target[0, 4:] = PAD
    target[2, 6] = PAD
    seen = []

    def recorded(block):
        def run(h, t, *args):
            seen.append(t)
            return block(h, t, *args)
        return run

    monkeypatch.setattr(optim, "_block", recorded(optim._block))
    monkeypatch.setattr(optim, "_compiled_block", lambda compile: recorded(optim._block_to_compile))  # its form, eager
    loss, n = generator_nll(hidden, generator, target, PAD, 0.1, rows=4, count=17 if given else None,
                            compiled=compiled)
    loss.backward()
    assert n == 17 and torch.equal(torch.cat(seen), target[target != PAD])  # blocks of 4, 4, 4, 4, 1
    got = hidden.grad
    hidden.grad = None
    expected, _ = label_smoothed_nll(generator(hidden), target, PAD, 0.1)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert torch.equal(got[target == PAD], torch.zeros(4, 5, dtype=torch.float64))
    assert torch.allclose(got, hidden.grad, atol=1e-12)


def test_generator_nll_under_bf16_autocast_stays_close_to_float32():
    """The products run in bf16, the softmax and the sums in float32: the gradients match the types of the inputs."""
    torch.manual_seed(0)
    generator = torch.nn.Linear(16, 50)
    hidden = torch.randn(40, 16, requires_grad=True)
    target = torch.randint(1, 50, (40,))
    exact, _ = generator_nll(hidden, generator, target, PAD, 0.1, rows=16)
    exact.backward()
    exact_grad = hidden.grad.clone()
    hidden.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = generator_nll(hidden, generator, target, PAD, 0.1, rows=16)
    loss.backward()
    assert loss.dtype == torch.float32 and hidden.grad.dtype == generator.weight.grad.dtype == torch.float32
    assert loss.item() == pytest.approx(exact.item(), rel=1e-2)
    assert torch.allclose(hidden.grad, exact_grad, atol=2e-2 * exact_grad.abs().max().item())


def test_widening_bf16_logits_by_a_cast_gives_what_the_mixed_subtraction_gives(monkeypatch):
    """A CPU casts each block of bf16 logits to float32 before shifting it; a GPU (or a compiled model)
    subtracts in mixed precision. The cast is exact, so the two give the same loss and gradients, bit for bit."""
    torch.manual_seed(0)
    generator = torch.nn.Linear(16, 50)
    hidden = torch.randn(40, 16, requires_grad=True)
    target = torch.randint(0, 50, (40,))

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = generator_nll(hidden, generator, target, PAD, 0.1, rows=16)
        loss.backward()
        grads = [t.grad for t in (hidden, generator.weight, generator.bias)]
        hidden.grad = generator.weight.grad = generator.bias.grad = None
        return [loss, *grads]

    cast = run()
    monkeypatch.setattr("transformer.fast.loss.eager_on_cpu", lambda x: False)  # the form a GPU takes
    mixed = run()
    assert all(torch.equal(a, b) for a, b in zip(cast, mixed))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_bf16_gradient_is_the_exact_one_rounded_once(smoothing):
    """Under autocast the loss's gradient is written straight in bf16: every entry, the pad and gold ones too,
    is the exact gradient (float64) rounded once, to within float32's error, and padding rows all zero. The
    float32 form cast to bf16 did worse at the pad: a pad probability under float32's unit of `other` came
    out 0 ((p - other) + other)."""
    from transformer.fast.loss import _softmax_minus_target_, _softmax_minus_target_in

    torch.manual_seed(0)
    z = torch.randn(300, 500) * 4
    target = torch.randint(0, 500, (300,))
    target[:30] = PAD
    e = (z - z.amax(dim=1, keepdim=True)).exp()
    scale, row_sum = (target != PAD).float() * 0.37, e.sum(dim=1)
    exact = _softmax_minus_target_(e.double(), target, PAD, smoothing, scale.double(), row_sum.double())
    got = _softmax_minus_target_in(torch.bfloat16, e, target, PAD, smoothing, scale, row_sum)
    assert got.dtype == torch.bfloat16 and got.shape == exact.shape
    assert torch.allclose(got.double(), exact, rtol=2**-8, atol=1e-8) and (got[:30] == 0).all()  # bf16's half unit
    assert torch.allclose(got[:, PAD].double(), exact[:, PAD], rtol=2**-8, atol=0)  # the smallest too


def test_the_bf16_loss_moves_less_than_float32_and_a_cast(monkeypatch):
    """The loss's block under bf16 autocast, counted as a GPU would move it (benchmarks/throughput/gpu_traffic.py): the
    gradient made in bf16 at once moves 45 bytes an (n, V) entry where float32 and a cast moved 63."""
    from benchmarks.throughput.gpu_traffic import Traffic

    monkeypatch.setattr("transformer.fast.loss.eager_on_cpu", lambda x: False)  # the form a GPU takes
    torch.manual_seed(0)
    n, V = 256, 4000
    generator, hidden = torch.nn.Linear(64, V), torch.randn(n, 64, requires_grad=True)
    target = torch.randint(1, V, (n,))
    with torch.autocast("cpu", dtype=torch.bfloat16), Traffic() as traffic:
        generator_nll(hidden, generator, target, PAD, 0.1, rows=n)
    assert sum(moved for _, _, moved, _ in traffic.ops) / (n * V) < 46


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_the_smoothed_loss_floor_is_the_loss_of_predicting_the_smoothed_targets(smoothing):
    """No logits reach a lower label-smoothed loss than the floor, and predicting the smoothed
    distribution itself reaches it."""
    from transformer.loss import smoothed_loss_floor

    V, target = 12, torch.tensor([3, 5, 7, 11])
    dist = smoothed_targets(target, V, PAD, smoothing)
    best, n = label_smoothed_nll(dist.clamp_min(1e-30).log(), target, PAD, smoothing)
    assert best.item() / n == pytest.approx(smoothed_loss_floor(V, smoothing), abs=1e-5)
    torch.manual_seed(0)
    for _ in range(20):
        loss, n = label_smoothed_nll(torch.randn(4, V) * 3, target, PAD, smoothing)
        assert loss.item() / n > smoothed_loss_floor(V, smoothing)


@pytest.mark.parametrize("precision", ["float64", "bf16"])
def test_the_compiled_loss_is_the_eager_loss(precision, monkeypatch):
    """generator_nll(compiled=True), as train.compile runs it: each block by ``_block_to_compile`` under
    torch.compile, the gradient's target made by comparisons. The same loss and gradients as the eager blocks
    (float64: to rounding; under bf16 autocast: each gradient entry rounded once either way), over blocks of 4
    rows and a shorter last one: two graphs (the second for any number of rows), no break; the compiled
    function made once for two batches (making it costs milliseconds). The aot_eager backend traces as
    inductor does, without its C++ build."""
    from torch._dynamo.utils import counters

    from tests.conftest import torch_compile_defaults

    torch.manual_seed(0)
    dtype = torch.float64 if precision == "float64" else torch.float32
    generator = torch.nn.Linear(16, 50).to(dtype)
    hidden = torch.randn(3, 7, 16, dtype=dtype, requires_grad=True)
    target = torch.randint(1, 50, (3, 7))
    target[0, 4:] = PAD

    def run(compiled):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss, n = generator_nll(hidden, generator, target, PAD, 0.1, rows=4, compiled=compiled)
        (2.5 * loss).backward()
        grads = [t.grad for t in (hidden, generator.weight, generator.bias)]
        hidden.grad = generator.weight.grad = generator.bias.grad = None
        return [loss, *grads], n

    eager, n = run(compiled=False)
    made, torch_compile = [], torch.compile

    def compile(fn, **kwargs):
        made.append(fn)
        return torch_compile(fn, backend="aot_eager", **kwargs)

    monkeypatch.setattr(torch, "compile", compile)
    torch._dynamo.reset()
    counters.clear()
    with torch_compile_defaults():
        compiled, n_compiled = run(compiled=True)
        assert all(torch.equal(a, b) for a, b in zip(run(compiled=True)[0], compiled))  # a second batch
    assert len(made) == 1 and n == n_compiled == 21 - 3
    assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"], dict(counters)
    for got, want in zip(compiled, eager):
        assert got.dtype == want.dtype
        if precision == "float64":
            assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
        else:  # a product's bf16 rounding moves a sum by up to ~1% of its largest term
            assert torch.allclose(got, want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


def test_the_compiled_loss_moves_half_what_the_eager_one_moves(monkeypatch):
    """The loss's block under bf16 autocast, counted as a GPU would move it (benchmarks/throughput/gpu_traffic.py),
    eager and as train.compile runs it (its kernels as inductor fuses them, counted, not built): fused, the passes
    over the (n, V) logits are two reductions, the gradient's kernel and the bias's sum, and the block moves
    18 bytes an entry where eager it moves 40 (n 1024, V 4000, C 64)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from benchmarks.throughput.gpu_traffic import Traffic
    from benchmarks.throughput.inductor_count import counted_compile

    monkeypatch.setattr("transformer.fast.loss.eager_on_cpu", lambda x: False)  # the form a GPU takes
    n, V = 1024, 4000
    moved = {}
    for compiled in (False, True):
        traffic = Traffic()
        with FakeTensorMode(allow_non_fake_inputs=True), counted_compile(traffic):
            generator, hidden = torch.nn.Linear(64, V), torch.randn(n, 64, requires_grad=True)
            target = torch.randint(1, V, (n,))
            with torch.autocast("cpu", dtype=torch.bfloat16), traffic:
                generator_nll(hidden, generator, target, PAD, 0.1, rows=n, count=n, compiled=compiled)
        moved[compiled] = sum(bytes_moved for _, _, bytes_moved, _ in traffic.ops) / (n * V)
    assert moved[True] < 20 and moved[True] < 0.5 * moved[False], moved

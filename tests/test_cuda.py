"""What must hold on a GPU: run by tools/gpu_check.sh (`pytest -m cuda`); skipped without CUDA."""

import contextlib

import pytest
import torch

from transformer.fast.attention import grouped_attention
from transformer.masks import padding_mask
from transformer.model import build_model
from transformer.fast.loss import generator_nll
from tests.conftest import model_config
from tests.test_decoding import IDS, V, sources

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.mark.parametrize("scale", [1, 8])
def test_bf16_attention_stays_finite_and_close_to_fp32(scale):
    """Large scores (scale 8: logits in the hundreds) must stay finite; at unit scale bf16 must track fp32.

    At scale 8 the softmax is nearly one-hot and bf16's rounding of the scores
    (~0.4%) can swap near-tied keys, so closeness is asserted at unit scale only.
    """
    q, k, v = (torch.randn(4, 8, 64, 32, device="cuda") * scale for _ in range(3))
    mask = padding_mask(torch.tensor([[1] * 60 + [0] * 4] * 4, device="cuda"), 0)
    mask[0] = False  # one fully masked example
    exact, _ = grouped_attention(q, k, v, mask)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        low, weights = grouped_attention(q, k, v, mask)
    assert torch.isfinite(low).all() and torch.all(low[0] == 0)
    assert torch.allclose(weights.float().sum(-1)[1:], torch.ones(3, 8, 64, device="cuda"), atol=1e-2)
    if scale == 1:
        assert torch.allclose(low.float(), exact, atol=0.05)


def test_training_step_and_cached_decoding_on_cuda():
    from transformer.decoding import Decoder

    torch.manual_seed(0)
    model = build_model(model_config(tie_embeddings=True), "seq2seq", V, V, True, fast=True).cuda()
    src = sources().cuda()
    tgt = torch.randint(4, V, (src.size(0), 10), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):  # as the train stage does it: the fused output layer + loss
        hidden = model(src, tgt, padding_mask(src, IDS.pad), None, project=False)
        loss, n = generator_nll(hidden, model.generator, tgt, IDS.pad, 0.1)
    (loss / n).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    cached, uncached = Decoder(model, src, IDS, True), Decoder(model, src, IDS, False)
    out = torch.full((src.size(0), 1), IDS.bos, device="cuda")
    for t in range(tgt.size(1)):
        assert torch.allclose(cached.logits(out), uncached.logits(out), atol=1e-4), t
        out = torch.cat([out, tgt[:, t:t + 1]], dim=1)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_searches_on_cuda_report_the_scores_teacher_forcing_gives(beam_size):
    """Greedy and beam search keep their running log-probabilities on the device; teacher forcing there
    gives the same scores (what evaluate's search and model errors compare)."""
    from lib.evaluate.decode import score_outputs, translate_n_best
    from tests.test_decoding import unpadded

    torch.manual_seed(0)
    model = build_model(model_config(tie_embeddings=True), "seq2seq", V, V, True, fast=True).cuda().eval()
    srcs = unpadded(sources())
    found = [h[0] for h in translate_n_best(model, srcs, IDS, 4096, 4, beam_size, alpha=0.6)]
    again = score_outputs(model, srcs, [h.tokens for h in found], IDS, 4096, 0.6, [h.eos for h in found])
    for h, g in zip(found, again):
        assert (h.tokens, h.eos) == (g.tokens, g.eos)
        assert abs(h.score - g.score) < 1e-3 and abs(h.log_prob - g.log_prob) < 1e-3


def test_dropout_on_cuda_drops_at_its_rate_and_keeps_the_expectation():
    from transformer.fast.dropout import ByteDropout as Dropout

    x = torch.ones(1 << 20, device="cuda")
    y = Dropout(0.2).train()(x)
    assert abs((y == 0).float().mean().item() - 0.2) < 0.005
    assert abs(y.mean().item() - 1.0) < 0.01


def test_fused_output_layer_gpu_blocks_match_small_ones():
    """The GPU's default block (8192 rows) against 256-row blocks: the same loss and gradients."""
    hidden = torch.randn(20000, 64, device="cuda", requires_grad=True)
    generator = torch.nn.Linear(64, 500).cuda()
    target = torch.randint(0, 500, (20000,), device="cuda")
    results = []
    for rows in (None, 256):
        loss, n = generator_nll(hidden, generator, target, 0, 0.1, rows=rows)
        grads = torch.autograd.grad(loss, [hidden, generator.weight, generator.bias])
        results.append((loss, n, grads))
    (loss, n, grads), (small_loss, small_n, small_grads) = results
    assert n == small_n and torch.allclose(loss, small_loss, rtol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(grads, small_grads))


@contextlib.contextmanager
def never_waiting():
    """Within it, an operation that makes the host wait for the GPU raises (the queue drained first)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_the_forward_pass_never_waits_for_the_gpu():
    """No host-device synchronisation inside the model: each one stalls the Python thread that
    queues the kernels until the GPU has drained its queue (e.g. a `bool(tensor)` branch).
    The backward pass is left out: PyTorch's own embedding backward synchronises on CUDA."""
    from tests.test_model import both_forward_passes

    forward = both_forward_passes("cuda")  # building and copying to the GPU may sync; the passes may not
    with never_waiting(), torch.autocast("cuda", dtype=torch.bfloat16):
        forward()


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "alibi"])
def test_the_train_stages_losses_never_wait_for_the_gpu(positional):
    """The forward passes with the train stage's losses (whose fused output layer makes its gradients
    there): a step's one wait is its logged loss. The seq2seq loss counted its targets on the device, a
    wait at every batch; ALiBi made its distances on the CPU and could not add them to the scores."""
    from tests.test_model import training_losses

    losses = training_losses("cuda", positional=positional)
    with never_waiting(), torch.autocast("cuda", dtype=torch.bfloat16):
        seq2seq_loss, lm_loss = losses()
    assert torch.isfinite(seq2seq_loss) and torch.isfinite(lm_loss)


def test_a_batch_goes_to_the_gpu_without_waiting_for_it():
    """Batch.to queues its copies from pinned memory. A copy from pageable memory makes the host
    wait for the GPU's whole queue, the previous step's kernels included, once per tensor."""
    from lib.data.pairs import Pairs, collate

    batch = collate(Pairs([[5, 6, 7], [8]], [[9], [10, 11]]), [0, 1], IDS)
    with never_waiting():
        moved = batch.to(torch.device("cuda"))
    for name in ("src", "tgt_in", "tgt_out"):
        assert getattr(moved, name).is_cuda and torch.equal(getattr(moved, name).cpu(), getattr(batch, name))


def test_auto_precision_picks_bf16_on_a_gpu_that_has_it():
    from lib.model.device import resolve_precision

    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp32"  # Ampere and later have it
    assert resolve_precision("auto", torch.device("cuda"), flags=set()) == expected


def test_an_lm_scores_a_text_on_cuda_as_on_the_cpu():
    """evaluation.text_metrics (the evaluate stage, lib.use.inference's LanguageModel.score) reads a CPU text
    with a model on the GPU."""
    from lib.evaluate.evaluation import text_metrics

    torch.manual_seed(0)
    cfg = model_config(encoder_layers=0, norm_first=True, tie_embeddings=True)
    model = build_model(cfg, "lm", V, V, True, fast=True).eval()
    ids = torch.randint(4, V, (50,))
    here = text_metrics(model, ids, 50, 16)
    there = text_metrics(model.cuda(), ids, 50, 16)
    assert there["loss"] == pytest.approx(here["loss"], rel=1e-4) and there["tokens"] == here["tokens"]


def test_raising_epochs_resumes_on_cuda_to_the_same_model(tmp_path, tiny_params):
    """A checkpoint resumes on the GPU: it is loaded onto the CPU (a generator takes its state only from there),
    and the GPU's generator, which draws dropout's masks there, is restored too: 1 epoch and then 2 end on the
    model of 2 epochs straight."""
    from lib.model import checkpoint
    from lib.train import training
    from lib.tasks.params import stage_config
    from tests.test_distributed import assert_same_model, prepare

    tiny_params["cumsum"]["train"]["device"] = "cuda"
    prepare(tmp_path, tiny_params, "cumsum")

    def train(name: str, epochs: int):
        tiny_params["cumsum"]["train"]["epochs"] = epochs
        out = tmp_path / name
        return training.run("cumsum", stage_config(tiny_params, "cumsum", "train"), tmp_path / "data",
                            tmp_path / "tok", out / "model.pt", out / "ckpt", out / "live"), out

    train("resumed", 1)
    summary, resumed = train("resumed", 2)
    assert summary["resumed"] and "cuda" in checkpoint.load(resumed / "ckpt" / "last.pt")["rng"][0]
    _, straight = train("straight", 2)
    assert checkpoint.load(straight / "model.pt")["step"] == summary["step"]  # the best is the last epoch
    assert_same_model(straight / "model.pt", resumed / "model.pt")

"""Incremental decoding, beam search and sampling against their definitions."""

import itertools
import math
import re

import pytest
import torch

from transformer.decoding import Decoder, Hypothesis, length_penalty
from transformer.greedy import greedy_search
from transformer import beam
from transformer.beam import beam_search
from transformer.sampling import sample, top_k_filter, top_p_filter
from lib.evaluate.decode import score_outputs, translate_n_best
from transformer.model import Transformer, TransformerLM
from lib.data.tokenizer import SpecialIds
from tests.conftest import model_config

IDS = SpecialIds(pad=0, bos=1, eos=2, unk=3)
V = 23


def sources(B=6, S=9, seed=0) -> torch.Tensor:
    """Random source ids with right padding of different lengths: (B, S)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    for b, length in enumerate(torch.randint(2, S + 1, (B,), generator=g).tolist()):
        src[b, length:] = IDS.pad
    return src


def greedy_decode(model, src, ids, limit, use_cache=True) -> list[list[int]]:
    """greedy_search's outputs alone."""
    return [h.tokens for h in greedy_search(model, src, ids, limit, use_cache=use_cache)]


def unpadded(src: torch.Tensor) -> list[list[int]]:
    return [row[row != IDS.pad].tolist() for row in src]


def seq2seq(positional="sinusoidal", norm_first=False, seed=0) -> Transformer:
    torch.manual_seed(seed)
    cfg = model_config(positional=positional, norm_first=norm_first, tie_embeddings=True)
    model = Transformer(cfg, V, V, joint_vocab=True).eval()
    with torch.no_grad():  # sharper than at initialisation, so that searches differ
        model.generator.weight.mul_(4.0)
    return model


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "alibi"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_and_uncached_seq2seq_logits_agree_at_every_step(positional, norm_first):
    model, src = seq2seq(positional, norm_first), sources()
    target = torch.randint(4, V, (src.size(0), 12))
    cached, uncached = Decoder(model, src, IDS, use_cache=True), Decoder(model, src, IDS, use_cache=False)
    out = torch.full((src.size(0), 1), IDS.bos)
    for t in range(target.size(1)):
        assert torch.allclose(cached.logits(out), uncached.logits(out), atol=1e-5), f"step {t}"
        out = torch.cat([out, target[:, t:t + 1]], dim=1)


@pytest.mark.parametrize("positional", ["sinusoidal", "rope", "alibi"])
@pytest.mark.parametrize("kv_heads", [0, 1])
def test_cached_and_uncached_lm_logits_agree_at_every_step(positional, kv_heads):
    """kv_heads 1: multi-query attention, whose cache holds one key/value head a layer."""
    torch.manual_seed(0)
    model = TransformerLM(model_config(positional=positional, norm_first=True, n_kv_heads=kv_heads), V).eval()
    ids = torch.randint(0, V, (3, 20))
    cache = model.new_cache()
    with torch.no_grad():
        prefix = model(ids[:, :5], cache, 0)  # a prompt goes in at once
        assert torch.allclose(prefix, model(ids[:, :5]), atol=1e-5)
        for t in range(5, ids.size(1)):
            step = model(ids[:, t:t + 1], cache, t)[:, -1]
            assert torch.allclose(step, model(ids[:, :t + 1])[:, -1], atol=1e-5), f"step {t}"
    assert cache[0]["k"].size(1) == model.cfg.kv_heads


def test_cached_greedy_equals_uncached_greedy():
    model, src = seq2seq(), sources(B=8)
    limit = torch.full((8,), 15)
    assert greedy_decode(model, src, IDS, limit) == greedy_decode(model, src, IDS, limit, use_cache=False)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_of_one_is_greedy_without_a_length_penalty_and_never_worse_with_one(seed):
    """One live hypothesis and one finished: greedy's output always ends among the candidates, so the beam's best
    scores at least as well; without a penalty nothing live can then beat it, so it is greedy's."""
    model, src = seq2seq(seed=seed), sources(B=8, seed=seed)
    limit = (src != IDS.pad).sum(1) + 3
    greedy = greedy_search(model, src, IDS, limit, alpha=0.6)
    assert [b[0].tokens for b in beam_search(model, src, IDS, limit, beam_size=1)] == [g.tokens for g in greedy]
    for [best], g in zip(beam_search(model, src, IDS, limit, beam_size=1, alpha=0.6), greedy):
        assert best.score >= g.score - 1e-5


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_every_reported_score_is_the_models_log_probability(alpha):
    model, src = seq2seq(), sources(B=5)
    limit = (src != IDS.pad).sum(1) + 4
    beams = beam_search(model, src, IDS, limit, beam_size=4, alpha=alpha, n_best=4)
    for source, hypotheses in zip(unpadded(src), beams):
        assert len(hypotheses) == 4
        assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)
        # Teacher-forced, all four in one padded batch: the search's running sums, recomputed.
        scored = score_outputs(model, [source] * 4, [h.tokens for h in hypotheses], IDS, 4096, alpha,
                               [h.eos for h in hypotheses])
        for h, expected in zip(hypotheses, scored):
            assert h.score == pytest.approx(expected.score, abs=1e-4)
            assert h.log_prob == pytest.approx(expected.log_prob, abs=1e-4)
            assert (h.tokens, h.eos) == (expected.tokens, expected.eos)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_n_best_of_one_beam_runs_greedy_and_scores_it_as_beam_search_would(alpha):
    model, src = seq2seq(seed=4), sources(B=12, seed=4)
    sources_ = unpadded(src)
    limit = torch.tensor([len(s) + 1 for s in sources_])  # one extra token: some outputs are cut before their eos
    greedy = translate_n_best(model, sources_, IDS, 4096, 1, beam_size=1, alpha=alpha)
    assert [[h.tokens] for h in greedy_search(model, src, IDS, limit)] == [[h.tokens for h in g] for g in greedy]
    assert {h[0].eos for h in greedy} == {True, False}
    scored = score_outputs(model, sources_, [g.tokens for [g] in greedy], IDS, 4096, alpha, [g.eos for [g] in greedy])
    for [g], expected in zip(greedy, scored):
        assert (g.score, g.log_prob) == pytest.approx((expected.score, expected.log_prob), abs=1e-4)


def test_scores_in_a_batch_equal_scores_alone():
    model, src = seq2seq(seed=1), sources(B=8, seed=1)
    outputs = unpadded(sources(B=8, seed=2))
    together = score_outputs(model, unpadded(src), outputs, IDS, 4096, alpha=0.6)
    alone = score_outputs(model, unpadded(src), outputs, IDS, 1, alpha=0.6)  # a budget of one: one pair a batch
    assert [h.score for h in together] == pytest.approx([h.score for h in alone], rel=1e-6)
    assert all(h.eos for h in together) and [h.tokens for h in together] == outputs


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_never_scores_below_greedy(alpha):
    model, src = seq2seq(seed=3), sources(B=16, seed=3)
    limit = (src != IDS.pad).sum(1) + 4
    greedy = greedy_decode(model, src, IDS, limit)
    beams = beam_search(model, src, IDS, limit, beam_size=5, alpha=alpha)
    better = 0
    eos = [len(tokens) < limit[b] for b, tokens in enumerate(greedy)]  # greedy stops early only at eos
    greedy_scores = score_outputs(model, unpadded(src), greedy, IDS, 4096, alpha, eos)
    for best, greedy_score in zip(beams, (h.score for h in greedy_scores)):
        assert best[0].score >= greedy_score - 1e-5
        better += best[0].score > greedy_score + 1e-5
    assert better > 0  # the search found something greedy missed


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_stopping_a_sentence_once_nothing_live_can_beat_its_finished_ones_changes_no_result(alpha, monkeypatch):
    """The same n-best lists as searching every sentence to its limit, with fewer rows stepped."""
    model, src = seq2seq(seed=5), sources(B=12, seed=5)
    with torch.no_grad():  # eos likelier, so that hypotheses finish well before their limits
        model.generator.bias[IDS.eos] += 6.0
    limit = (src != IDS.pad).sum(1) + 6
    steps = []
    logits = Decoder.logits
    monkeypatch.setattr(Decoder, "logits", lambda self, out: steps.append(len(out)) or logits(self, out))
    early = beam_search(model, src, IDS, limit, beam_size=4, alpha=alpha, n_best=2)
    early_rows, steps[:] = sum(steps), []
    never = lambda log_prob, *_: log_prob.masked_fill(log_prob > float("-inf"), float("inf"))  # noqa: E731 - short
    monkeypatch.setattr(beam, "best_reachable", never)
    to_the_limit = beam_search(model, src, IDS, limit, beam_size=4, alpha=alpha, n_best=2)
    assert [[(h.tokens, h.eos) for h in hs] for hs in early] == [[(h.tokens, h.eos) for h in hs] for hs in to_the_limit]
    assert early_rows < sum(steps) and len(steps) == int(limit.max())


def test_sentences_leave_the_batch_as_they_finish_and_find_what_they_find_alone():
    model, src = seq2seq(seed=6), sources(B=8, seed=6)
    limit = (src != IDS.pad).sum(1) + 4
    rows = []
    logits = Decoder.logits
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Decoder, "logits", lambda self, out: rows.append(len(out)) or logits(self, out))
        together = beam_search(model, src, IDS, limit, beam_size=3, alpha=0.6, n_best=3)
    assert rows[0] == 8 * 3 and rows[-1] < rows[0] and rows == sorted(rows, reverse=True)
    assert all(r % 3 == 0 for r in rows)  # a sentence leaves with all its beams
    for b in range(8):
        [alone] = beam_search(model, src[b:b + 1], IDS, limit[b:b + 1], beam_size=3, alpha=0.6, n_best=3)
        assert [h.tokens for h in alone] == [h.tokens for h in together[b]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[b]], abs=1e-5)


def test_cached_and_uncached_beams_agree():
    model, src = seq2seq(), sources(B=6)
    limit = (src != IDS.pad).sum(1) + 4
    cached = beam_search(model, src, IDS, limit, beam_size=3, alpha=0.6, n_best=3)
    uncached = beam_search(model, src, IDS, limit, beam_size=3, alpha=0.6, n_best=3, use_cache=False)
    assert [[h.tokens for h in b] for b in cached] == [[h.tokens for h in b] for b in uncached]


def test_top_k_and_top_p_never_sample_outside_the_allowed_set():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])  # probabilities ~ .23 .09 .05 .03 .01 .6
    probs = torch.softmax(logits, -1)
    g = torch.Generator().manual_seed(0)
    allowed_k = set(logits.topk(2).indices.tolist())  # {5, 0}
    order = probs.argsort(descending=True)
    need = int((probs[order].cumsum(0) < 0.85).sum()) + 1  # the smallest set reaching 0.85
    allowed_p = set(order[:need].tolist())
    for filtered, allowed in ((top_k_filter(logits, 2), allowed_k), (top_p_filter(logits, 0.85), allowed_p),
                              (top_p_filter(top_k_filter(logits, 3), 0.5), {5})):
        draws = torch.multinomial(torch.softmax(filtered, -1), 2000, replacement=True, generator=g)
        assert set(draws.tolist()) == allowed
    assert torch.equal(top_p_filter(logits, 1.0), logits) and torch.equal(top_k_filter(logits, 0), logits)


@pytest.mark.parametrize("p, kept", [(0.5, 1), (0.75, 2), (0.76, 3), (1.0, 4)])
def test_top_p_keeps_the_smallest_set_whose_probabilities_reach_p(p, kept):
    """Nucleus sampling (Holtzman et al., 2020): probabilities 1/2, 1/4, 1/8, 1/8, exact in binary, so that a
    set reaching p exactly is told apart from one that passes it."""
    logits = torch.tensor([0.5, 0.25, 0.125, 0.125]).log()
    assert top_p_filter(logits, p).isfinite().tolist() == [True] * kept + [False] * (4 - kept)


def test_sampling_is_seeded_and_cache_free_sampling_matches():
    torch.manual_seed(0)
    model = TransformerLM(model_config(max_len=16), V).eval()
    runs = [sample(model, [5, 6], 30, 0.9, 5, torch.Generator().manual_seed(7), block_size=16, top_p=0.9,
                   use_cache=cache) for cache in (True, True, False)]
    assert runs[0] == runs[1] == runs[2]  # past the 16-token block the window slides, cached or not
    assert len(runs[0]) == 32 and runs[0][:2] == [5, 6]


def test_sampling_past_the_block_reads_the_last_block_size_tokens():
    """Once the text outgrows the model's block, each token is drawn from what the last block_size tokens
    predict (nanoGPT's crop), here recomputed step by step from the same seeded generator."""
    torch.manual_seed(0)
    model = TransformerLM(model_config(max_len=8), V).eval()
    drawn = sample(model, [5, 6], 20, 1.0, 0, torch.Generator().manual_seed(3), block_size=8, use_cache=False)
    generator, expected = torch.Generator().manual_seed(3), [5, 6]
    with torch.no_grad():
        for _ in range(20):
            logits = model(torch.tensor([expected[-8:]]))[0, -1]  # (V,)
            expected.append(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).item())
    assert drawn == expected


@pytest.mark.parametrize("temperature", [1e-30, 1e-45, 1e-300])
def test_a_temperature_near_zero_draws_the_likeliest_token_at_every_step(temperature):
    """At 1e-45 the largest logit / temperature was inf in float32, at 1e-300 the temperature itself was 0 (0 / 0):
    softmax gave NaN and torch.multinomial raised. A temperature near 0 is greedy decoding."""
    torch.manual_seed(0)
    model = TransformerLM(model_config(max_len=16), V).eval()
    drawn = sample(model, [5, 6], 10, temperature, 0, torch.Generator().manual_seed(0), block_size=16)
    expected = [5, 6]
    with torch.no_grad():
        for _ in range(10):
            expected.append(model(torch.tensor([expected]))[0, -1].argmax().item())
    assert drawn == expected


def test_no_output_outgrows_the_models_max_len():
    """The decoder reads bos and all but the last token of an output, so an output holds at most max_len - 1
    tokens (eos included): a longer limit (a long source's length + max_extra_tokens) is cut there, and the
    output is marked as cut (no eos). The eos is made unreachable, so that only the cap stops a search."""
    torch.manual_seed(0)
    model = Transformer(model_config(max_len=10, tie_embeddings=True), V, V, joint_vocab=True).eval()
    with torch.no_grad():
        model.generator.bias[IDS.eos] = -1e4
    src, limit = sources(B=4, S=9), torch.full((4,), 30)
    found = greedy_search(model, src, IDS, limit) + greedy_search(model, src, IDS, limit, use_cache=False)
    found += [h for hypotheses in beam_search(model, src, IDS, limit, beam_size=3, n_best=3) for h in hypotheses]
    assert len(found) == 4 + 4 + 4 * 3
    assert all(len(h.tokens) == 9 and not h.eos for h in found)


def test_an_alpha_whose_length_penalty_overflows_is_refused_naming_the_largest_that_does_not():
    """Past ((5 + max_len) / 6) ** alpha = float32's largest, beam search divided a ruled-out candidate's -inf by
    inf: the NaN ranked above every real candidate, and every output was lost (lib.use.generate --alpha 1000: an
    IndexError). An alpha just below the largest still searches to the longest output and scores it finitely."""
    torch.manual_seed(0)
    model = Transformer(model_config(max_len=10, tie_embeddings=True), V, V, joint_vocab=True).eval()
    with torch.no_grad():
        model.generator.bias[IDS.eos] = -1e4  # each output runs to max_len - 1 tokens, the largest penalty
    src = unpadded(sources(B=3, S=6))
    most = math.log(torch.finfo(torch.float32).max) / math.log((5 + 10) / 6)
    for beam_size in (1, 3):
        found = translate_n_best(model, src, IDS, 1000, 20, beam_size, alpha=0.999 * most, n_best=beam_size)
        assert all(len(hs) == beam_size and all(len(h.tokens) == 9 and math.isfinite(h.score) for h in hs)
                   for hs in found)
    message = re.escape(f"alpha {2 * most}: the length penalty ((5 + length) / 6) ** alpha overflows at this model's "
                        f"longest output (10 tokens) for an alpha above {most:.1f} (GNMT's: 0.6 to 1)")
    with pytest.raises(ValueError, match=message):
        translate_n_best(model, src, IDS, 1000, 20, 3, alpha=2 * most)
    with pytest.raises(ValueError, match=message):
        score_outputs(model, src, [[4, 5]] * 3, IDS, 1000, alpha=2 * most)


def test_a_model_left_in_training_mode_with_dropout_is_refused_by_every_search_and_score():
    """Forgetting model.eval() after training: each step would be drawn from a randomly thinned model."""
    src = sources(B=3)
    limit = (src != IDS.pad).sum(1) + 2
    translator = Transformer(model_config(dropout=0.1, tie_embeddings=True), V, V, joint_vocab=True).train()
    lm = TransformerLM(model_config(dropout=0.1, max_len=16), V).train()
    calls = [lambda: greedy_search(translator, src, IDS, limit), lambda: beam_search(translator, src, IDS, limit, 3),
             lambda: score_outputs(translator, unpadded(src), unpadded(src), IDS, 4096),
             lambda: sample(lm, [5, 6], 4, 1.0, 0, torch.Generator().manual_seed(0), block_size=16)]
    for call in calls:
        with pytest.raises(ValueError, match=r"the model is in training mode, .* call model\.eval\(\) before"):
            call()
    translator.eval(), lm.eval()
    assert all(call() for call in calls)
    assert greedy_decode(seq2seq().train(), src, IDS, limit)  # training mode without dropout draws nothing


def every_output(words: list[int], limit: int) -> list[tuple[list[int], bool]]:
    """Every output of at most ``limit`` tokens, the eos included, as (tokens, ended with eos)."""
    ended = [(list(seq), True) for n in range(limit) for seq in itertools.product(words, repeat=n)]
    return ended + [(list(seq), False) for seq in itertools.product(words, repeat=limit)]


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_a_beam_wide_enough_to_keep_every_output_is_exact_search(alpha):
    """Beam search against its definition: with as many beams as there are outputs, nothing is pruned, and its
    ranking must be the ranking of every output, each scored alone by teacher forcing. 3 real tokens and <unk>;
    at most 3 tokens with the eos (1 + 4 + 16 ending in eos, 64 cut there) for one sentence, 2 for the other."""
    torch.manual_seed(0)
    model = Transformer(model_config(tie_embeddings=True), 7, 7, joint_vocab=True).eval()
    with torch.no_grad():
        model.generator.weight.mul_(4.0)
    src, limits = torch.tensor([[4, 5, 6, 5], [6, 4, IDS.pad, IDS.pad]]), [3, 2]
    width = len(every_output([IDS.unk, 4, 5, 6], max(limits)))  # 85
    beams = beam_search(model, src, IDS, torch.tensor(limits), beam_size=width, alpha=alpha, n_best=width)
    for source, limit, found in zip(unpadded(src), limits, beams):
        outputs = every_output([IDS.unk, 4, 5, 6], limit)
        scored = score_outputs(model, [source] * len(outputs), [t for t, _ in outputs], IDS, 4096, alpha,
                               [e for _, e in outputs])
        ranked = sorted(scored, key=lambda h: h.score, reverse=True)
        assert [(h.tokens, h.eos) for h in found] == [(h.tokens, h.eos) for h in ranked]
        assert [h.score for h in found] == pytest.approx([h.score for h in ranked], abs=1e-4)


def test_the_length_penalty_is_gnmts_and_counts_the_eos():
    """((5 + |Y|) / 6) ** alpha (Wu et al., 2016, eq. 14): 1 for a one-token output, whatever alpha."""
    assert length_penalty(1, 0.6) == 1.0 and length_penalty(7, 0.0) == 1.0
    assert length_penalty(4, 1.0) == pytest.approx(1.5) and length_penalty(13, 0.5) == pytest.approx(3 ** 0.5)
    assert Hypothesis.of([7, 8, 9], -3.0, True, 1.0).score == pytest.approx(-3.0 / 1.5)  # 3 tokens + eos
    assert Hypothesis.of([7, 8, 9, 10], -3.0, False, 1.0).score == pytest.approx(-3.0 / 1.5)  # cut: no eos

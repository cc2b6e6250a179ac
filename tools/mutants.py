"""How strong are the tests? Plant one bug at a time in a copy of the tree and see whether a test fails.

Each mutation below is a mistake a first Transformer makes (a missing 1/sqrt(D),
a mask flipped, the target not shifted, a bias dropped, ...), or its pipeline
(a write not atomic, a resume without the optimizer's state, model.pt not the
best epoch's, ...), written as one exact replacement in one file. For each, the
tree (without .git, .venv and the pipeline's outputs) is copied to a scratch
directory, the replacement made, and the tests that should catch it run with
``pytest -x``: "killed" when one fails, "broken" when pytest could not run them,
"survived" when all pass (then no test can tell the mistake from the real
thing: write one). A mutation names the file it was written for; when its text is no longer
there (the code moved), the one file of lib/, transformer/ and stages/ that holds it exactly once is
mutated instead. "stale" means no file holds it once: update the mutation (``--check`` lists those
without running any test). Prints a JSON line per mutation, then a summary.
Run from the repository root (most take 2-15 s; the training, pipeline and user ones 0.5-3 minutes; the first 65,
46 minutes, the user family's 28, 27 minutes):
    PYTHONPATH=. python tools/mutants.py [--only SUBSTRING ...] [--family numeric] [--workdir /tmp/mutants] [--check]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The fast tests of the model's numerics, and the slower ones of training.
NUMERIC = ["tests/test_attention.py", "tests/test_model.py", "tests/test_decoding.py", "tests/test_optim.py",
           "tests/test_data.py", "tests/test_fast.py"]
TRAINING = ["tests/test_optim.py", "tests/test_distributed.py", "tests/test_lm.py", "tests/test_stages.py",
            "tests/test_multi30k.py"]
# The tests of what the stages promise a user: outputs whole or not at all, resuming as if never stopped,
# bad input named, the scores as documented (the quick files first: pytest -x stops at the first failure).
PIPELINE = ["tests/test_config.py", "tests/test_multi30k.py", "tests/test_lm.py", "tests/test_stages.py",
            "tests/test_distributed.py", "tests/test_pipeline.py"]
# The tests of what a user reads and runs: the data and vocabulary made, the searches and samples, the scores,
# lib.use.inference and lib.use.generate, the report.
USER = ["tests/test_data.py", "tests/test_decoding.py", "tests/test_model.py", "tests/test_multi30k.py",
        "tests/test_lm.py", "tests/test_stages.py", "tests/test_pipeline.py"]

# (what, file, the exact text, what it becomes, tests). Left out, as they change no result: a fresh run not
# deleting the last run's curves (dvclive's resume=False does), and the LM's processes each taking the whole
# batch (the same model at twice the work: DDP averages equal gradients).
MUTATIONS = [
    ("attention without 1/sqrt(D)", "transformer/fast/attention.py",
     "q3, k3.transpose(1, 2), alpha=D**-0.5)", "q3, k3.transpose(1, 2), alpha=1.0)", NUMERIC),
    ("softmax over the queries", "transformer/fast/attention.py",
     "F.softmax(scores.float(), dim=-1)", "F.softmax(scores.float(), dim=-2)", NUMERIC),
    ("the reference attention's softmax over the queries", "transformer/attention.py",
     "F.softmax(scores.float(), dim=-1)", "F.softmax(scores.float(), dim=-2)", NUMERIC),
    ("no output projection", "transformer/attention.py",
     "return self.out_proj(out), weights", "return out, weights", NUMERIC),
    ("fused q/k/v rows read in the wrong layout", "transformer/fast/attention.py",
     "view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)",
     "view(B, T, self.n_heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)", NUMERIC),
    ("heads split without the transpose", "transformer/attention.py",
     "return x.view(B, T, -1, self.head_dim).transpose(1, 2)", "return x.view(B, -1, T, self.head_dim)", NUMERIC),
    ("heads merged without the transpose", "transformer/attention.py",
     "out = out.transpose(1, 2).reshape(B, Tq, C)", "out = out.reshape(B, Tq, C)", NUMERIC),
    ("cross attention's bias dropped", "transformer/fast/attention.py",
     "None if b is None else b[rows])", "None)", NUMERIC),
    ("cross attention's keys and values swapped", "transformer/fast/attention.py",
     "q, (k, v) = self.query(x)", "q, (v, k) = self.query(x)", NUMERIC),
    ("RoPE turning the other way", "transformer/positions.py", "sin[:, 0::2] *= -1", "sin[:, 1::2] *= -1", NUMERIC),
    ("ALiBi's slopes off by one head", "transformer/positions.py",
     "2 ** (-8 * (i + 1) / n)", "2 ** (-8 * i / n)", NUMERIC),
    ("ALiBi's distances ignoring the cache's offset", "transformer/positions.py",
     "torch.arange(start, start + q_len, device=slopes.device),", "torch.arange(q_len, device=slopes.device),",
     NUMERIC),
    ("the causal mask flipped", "transformer/masks.py", "torch.tril(", "torch.triu(", NUMERIC),
    ("embeddings not scaled by sqrt(C)", "transformer/layers.py",
     "x = self.tokens(ids) * self.scale", "x = self.tokens(ids)", NUMERIC),
    ("a token id of V let through to nn.Embedding's message", "transformer/layers.py",
     "or high.item() >= vocab_size:", "or high.item() > vocab_size:", NUMERIC),
    ("a negative token id let through to nn.Embedding's message", "transformer/layers.py",
     "if low.item() < 0 or high.item()", "if high.item()", NUMERIC),
    ("an id's position named without the cache's offset", "transformer/layers.py",
     'f"{start + position} is outside', 'f"{position} is outside', NUMERIC),
    ("positions: cosines where the sines go", "transformer/positions.py",
     "table[:, 0::2] = torch.sin(", "table[:, 0::2] = torch.cos(", NUMERIC),
    ("positions ignoring the cache's offset", "transformer/positions.py",
     "return x + self.table[start:start + T]", "return x + self.table[:T]", NUMERIC),
    ("a Post-LN sublayer without its residual", "transformer/layers.py",
     "return norm(x + self.dropout(h)), weights", "return norm(self.dropout(h)), weights", NUMERIC),
    ("Post-LN cross attention reading the decoder", "transformer/layers.py",
     "self.cross_attn(x, memory, src_mask, cross_cache, start, need_weights)",
     "self.cross_attn(x, x, None, None, start, need_weights)", NUMERIC),
    ("Pre-LN without the encoder's final norm", "transformer/model.py",
     "self.encoder_norm = layer_norm(cfg) if cfg.norm_first else nn.Identity()",
     "self.encoder_norm = nn.Identity()", NUMERIC),
    ("GELU asked for, ReLU given", "transformer/layers.py",
     "h = F.gelu(h) if self.activation == \"gelu\" else torch.relu(h)", "h = torch.relu(h)", NUMERIC),
    ("tie_embeddings ignored", "transformer/model.py",
     "self.generator.weight = self.tgt_embed.tokens.weight\n", "pass\n", NUMERIC),
    ("the target not shifted right", "lib/data/pairs.py",
     "tgt_in = torch.cat([torch.full((len(indices), 1), ids.bos), tgt[:, :-1]], dim=1)", "tgt_in = tgt", NUMERIC),
    ("a batch one sentence over its token budget", "lib/data/pairs.py",
     "over = (len(current) + 1) * longest_if_added > max_tokens", "over = len(current) * longest_if_added > max_tokens",
     NUMERIC),
    ("a real-token batch one pair over its budget", "lib/data/pairs.py",
     "over = max(src_sum + src[i], tgt_sum + tgt[i]) > max_tokens", "over = max(src_sum, tgt_sum) > max_tokens",
     NUMERIC),
    ("label smoothing spread over V - 1 (the loss)", "transformer/fast/loss.py",
     "loss = loss - smoothing / (V - 2) * (total", "loss = loss - smoothing / (V - 1) * (total", NUMERIC),
    ("label smoothing spread over V - 1 (its gradient)", "transformer/fast/loss.py",
     "    return smoothing / (V - 2)\n", "    return smoothing / (V - 1)\n", NUMERIC),
    ("smoothing mass on pad (the gradient)", "transformer/fast/loss.py",
     "    e[:, pad_id] += other * row_scale  # q_pad = 0\n", "", NUMERIC),
    ("smoothing mass on pad (the gradient made in bf16)", "transformer/fast/loss.py",
     "    grad[:, pad_id] = (e[:, pad_id] * p_scale).to(low)  # q_pad = 0\n", "", NUMERIC),
    ("the gold token's gradient as any other's (made in bf16)", "transformer/fast/loss.py",
     "    grad[torch.arange(grad.size(0), device=grad.device), target] = gold.to(low)\n", "", NUMERIC),
    ("smoothing mass on pad (the loss compiled)", "transformer/fast/loss.py",
     "torch.where(column == pad_id, 0.0, other)", "other", NUMERIC),
    ("the gold token's whole mass, unsmoothed (the loss compiled)", "transformer/fast/loss.py",
     "torch.where(column == t[:, None], 1.0 - smoothing,", "torch.where(column == t[:, None], 1.0,", NUMERIC),
    ("padding rows through the output layer", "transformer/fast/loss.py",
     "    if count < len(target):  # the real rows", "    if False:  # the real rows", NUMERIC),
    ("the first count rows taken for the real ones", "transformer/fast/loss.py",
     "real = torch.argsort(target == pad_id, stable=True)[:count]", "real = torch.arange(len(target))[:count]",
     NUMERIC),
    ("Noam's warmup rising as step / warmup", "transformer/schedules.py",
     "step * warmup**-1.5)", "step * warmup**-1.0)", NUMERIC),
    ("Noam's steps counted from 2", "transformer/schedules.py", "    step = max(step, 1)\n", "    step = max(step, 1) + 1\n",
     NUMERIC),
    ("GNMT's length penalty as (6 + |Y|) / 6", "transformer/greedy.py",
     "return ((5 + length) / 6) ** alpha", "return ((6 + length) / 6) ** alpha", NUMERIC),
    ("greedy search choosing the least likely token", "transformer/greedy.py",
     "best, next_token = step.max(dim=-1)", "best, next_token = step.min(dim=-1)", NUMERIC),
    ("greedy's scores taken from the wrong rows once a sentence has left", "transformer/greedy.py",
     "log_prob[rows], limit[rows]", "log_prob[:len(rows)], limit[rows]", NUMERIC),
    ("a finished hypothesis scored one token short", "transformer/beam.py",
     "float(\"-inf\")) / length_penalty(n, alpha)", "float(\"-inf\")) / length_penalty(n - 1, alpha)", NUMERIC),
    ("hypotheses that ended carried on as live ones", "transformer/beam.py",
     "live, pick = log_prob.masked_fill(ends, float(\"-inf\")).topk(K, dim=1)", "live, pick = log_prob.topk(K, dim=1)",
     NUMERIC),
    ("a sentence stopped on its current length penalty, not the largest it can still reach", "transformer/beam.py",
     "length_penalty(limit, alpha).clamp(min=length_penalty(n, alpha))", "length_penalty(n, alpha)", NUMERIC),
    ("the fast cache's new keys written at its start", "transformer/fast/attention.py",
     "cache[\"k_buffer\"][:R, :, start:end], cache[\"v_buffer\"][:R, :, start:end] = k, v",
     "cache[\"k_buffer\"][:R, :, :end - start], cache[\"v_buffer\"][:R, :, :end - start] = k, v", NUMERIC),
    ("top-k keeping k + 1", "transformer/greedy.py",
     "kth = torch.topk(logits, k, dim=-1)", "kth = torch.topk(logits, k + 1, dim=-1)", NUMERIC),
    ("top-p keeping a token past p", "transformer/greedy.py", "drop_sorted = before >= p", "drop_sorted = before > p",
     NUMERIC),
    ("the cosine schedule's warmup one step ahead", "transformer/schedules.py",
     "        return lr * step / warmup\n", "        return lr * (step + 1) / warmup\n", TRAINING),
    ("weight decay on the embeddings", "lib/train/training.py",
     "if id(p) in linear_weights and id(p) not in embeddings]", "if id(p) in linear_weights or id(p) in embeddings]",
     TRAINING),
    ("gradient clipping 100 times too loose", "lib/train/steps.py",
     "return torch.nn.utils.clip_grad_norm_(parameters, clip_norm, foreach=True)",
     "return torch.nn.utils.clip_grad_norm_(parameters, clip_norm * 100, foreach=True)", TRAINING),
    ("gradients never zeroed", "lib/train/training.py",
     "            optimizer.zero_grad(set_to_none=True)\n            run.log(**{\"train/loss\": loss, \"train/lr\": lr, \"train/grad_norm\": grad_norm,\n                       **speed(tokens,", "            run.log(**{\"train/loss\": loss, \"train/lr\": lr, \"train/grad_norm\": grad_norm,\n                       **speed(tokens,", TRAINING),
    ("rank 0 taking every row of a global batch", "lib/core/distributed.py",
     "    mine = rows[ctx.rank::ctx.world]\n", "    mine = rows[ctx.rank::ctx.world] if ctx.rank else rows\n",
     TRAINING),
    ("the seq2seq loss counting its targets on the device: a GPU's host waits for the forward pass at every batch",
     "lib/model/losses.py", "smoothing, count=batch.n_tokens, compiled=compiled)", "smoothing, compiled=compiled)",
     NUMERIC),
    ("ALiBi's distances made on the CPU, whatever device the model is on", "transformer/positions.py",
     "torch.arange(start, start + q_len, device=slopes.device), torch.arange(k_len, device=slopes.device)",
     "torch.arange(start, start + q_len), torch.arange(k_len)", NUMERIC),
    # --- what the stages promise ---
    ("a failed write leaving its temporary file", "lib/core/files.py",
     "        if os.path.exists(tmp):\n            os.remove(tmp)\n", "        pass\n", PIPELINE),
    ("a checkpoint written in place (a crash leaves half of it)", "lib/model/checkpoint.py",
     "with atomic_path(path) as tmp, open(tmp, \"wb\") as file:", "with open(path, \"wb\") as file:", PIPELINE),
    ("a directory's previous version not put back after a failure", "lib/core/files.py",
     "    finally:\n        _put_back(previous, path)\n", "    finally:\n        pass\n", PIPELINE),
    ("outputs checked only when written, after the work", "lib/stage/cli.py",
     "            check_writable(getattr(args, name), kind == DIRECTORY, f\"--{name}\")\n", "            pass\n",
     PIPELINE),
    ("checkpoints unpickled whole (weights_only off)", "lib/model/checkpoint.py",
     "weights_only=True)", "weights_only=False)", PIPELINE),
    ("a model and a tokenizer from different runs let through", "lib/model/checkpoint.py",
     "if theirs != (state[\"src_vocab_size\"], state[\"tgt_vocab_size\"]):", "if False:", PIPELINE),
    ("a model of another task of the same kind let through", "lib/model/checkpoint.py",
     "if task is not None and state.get(\"task\", task) != task:", "if False:", PIPELINE),
    ("a split's missing text or number handed to the tokenizer", "lib/data/pairs.py",
     "        if not texts.all():\n", "        if False:\n", PIPELINE),
    ("an empty split let through to the stage", "lib/data/pairs.py",
     "    if frame.empty:  #", "    if False:  #", PIPELINE),
    ("a metrics.json that is no JSON object read all the same", "lib/report/reporting.py",
     "    if not isinstance(metrics, dict):\n", "    if False:\n", PIPELINE),
    ("a samples.jsonl line that is not JSON named without its number", "lib/report/reporting.py",
     'f"line {number}: not JSON ({err.msg})"', 'f"not JSON ({err.msg})"', PIPELINE),
    ("a sample without a key the report reads let through", "lib/report/reporting.py",
     "(missing := [k for k in keys if k not in row])", "(missing := [])", PIPELINE),
    ("a blank line of samples.jsonl taken for a sample", "lib/report/reporting.py",
     "        if not line.strip():  #", "        if False:  #", PIPELINE),
    ("an empty task list building nothing, silently", "lib/tasks/params.py", "    if not tasks:\n", "    if False:\n",
     ["tests/test_report_page.py"]),
    ("a resumed run's best.pt checked only when copied into model.pt, after training", "lib/train/run.py",
     'if self.state["best_valid_loss"] < math.inf:  #', "if False:  #", PIPELINE),
    ("a resumed run's missing best.pt named as never trained", "lib/train/run.py",
     "            if not self.best_path.is_file():\n                raise ValueError(",
     "            if False:\n                raise ValueError(", PIPELINE),
    ("an unreadable dvclive summary left for the resume to stop on", "lib/train/curves.py",
     "    if not readable:\n        log.warning(", "    if False:\n        log.warning(", PIPELINE),
    ("a curve row that is not numbers left for pandas", "lib/train/curves.py",
     "        rows = [line for number, line in enumerate(lines, 2) if number not in bad]", "        rows = lines",
     PIPELINE),
    ("a NaN loss written back as empty dropped as a bad row", "lib/train/curves.py",
     'float(text or "nan")', "float(text)", PIPELINE),
    ("an evaluated split longer than max_len found only after training", "lib/train/training.py",
     "    check_evaluated_lengths(task, {split: encode_pairs(tokenizers, read_split(data_dir, split))\n"
     "                                   for split in get_task(task).evaluated_splits}, cfg.model.max_len)\n", "",
     PIPELINE),
    ("an evaluated split longer than the model's max_len found only by the model, mid-evaluation",
     "lib/evaluate/evaluation.py", "    check_evaluated_lengths(task, encoded, model.cfg.max_len)", "    pass", PIPELINE),
    ("d_model not divisible by n_heads let through", "transformer/config.py",
     "self.d_model % self.n_heads == 0,", "True,", PIPELINE),
    ("a later stage's params checked only when it runs, after the work ahead of it", "lib/stage/cli.py",
     "        check_stages_after(params, args.task, stage)\n", "", PIPELINE),
    ("YAML's .inf or .nan taken for a number", "lib/core/config.py",
     "if isinstance(values[name], float) and not math.isfinite(values[name]):", "if False:", PIPELINE),
    ("beam search's alpha not held to train's max_len before training", "lib/tasks/params.py",
     "require(evaluate.alpha <= most,", "require(True,", PIPELINE),
    ("greedy search's unused alpha held to the bound", "lib/tasks/params.py", " and evaluate.beam_size > 1:", ":",
     PIPELINE),
    ("the LM's heatmap passage not held to its blocks before training", "lib/tasks/params.py",
     "require(report.passage_tokens <= train.block_size,", "require(True,", PIPELINE),
    ("resuming without the optimizer's state", "lib/train/run.py",
     "        self.optimizer.load_state_dict(saved[\"optimizer\"])\n", "", PIPELINE),
    ("resuming without dropout's random state", "lib/train/run.py",
     "        distributed.restore_random_state(saved[\"rng\"], self.ctx)\n", "", PIPELINE),
    ("resuming mid-epoch from the epoch's first batch", "lib/train/training.py",
     "todo = batches[state[\"batches_done\"]:]", "todo = batches", PIPELINE),
    ("resuming across a changed param", "lib/train/identity.py", "if old.get(key) != value:", "if False:", PIPELINE),
    ("resuming across changed data or code", "lib/train/identity.py",
     "if saved.get(\"inputs\") != identity[\"inputs\"]:", "if False:", PIPELINE),
    ("model.pt the last epoch's, not the best", "lib/train/run.py",
     "if valid_loss >= self.state[\"best_valid_loss\"]:\n            return False", "if False:\n            return False", PIPELINE),
    ("an average kept though it validates worse", "lib/train/training.py",
     "if cfg.average == \"if_better\" and valid_loss >= run.state[\"best_valid_loss\"]:\n        return None",
     "if False:\n        return None",
     PIPELINE),
    ("a diverged loss stepping on", "lib/train/run.py", "if not math.isfinite(loss):", "if False:", PIPELINE),
    ("patience waiting one epoch more", "lib/train/training.py",
     "state[\"epochs_since_best\"] >= cfg.patience", "state[\"epochs_since_best\"] > cfg.patience", PIPELINE),
    ("every epoch's batches in the same order", "lib/train/training.py",
     "manual_seed(cfg.seed * 1_000_003 + epoch)", "manual_seed(cfg.seed * 1_000_003)", PIPELINE),
    ("DDP's average not undone (the update a world's times too small)", "lib/train/training.py",
     "(weight * ctx.world)).backward()", "weight).backward()", PIPELINE),
    ("every process writing the models", "lib/train/run.py",
     "        if self.ctx.is_main:\n            t = self.trainee", "        if True:\n            t = self.trainee",
     PIPELINE),
    ("the ranks' dropout seeds 2**32 apart (one stream: the CPU's generator reads 32 bits)", "lib/core/distributed.py",
     "torch.manual_seed((seed + ctx.rank * RANK_SEED_STEP) % 2**32)", "torch.manual_seed(seed + (ctx.rank << 32))",
     PIPELINE),
    ("BLEU on lowercased text", "lib/tasks/multi30k.py",
     "bleu = sacrebleu.metrics.BLEU()", "bleu = sacrebleu.metrics.BLEU(lowercase=True)", PIPELINE),
    ("Multi30k read without NFC", "lib/tasks/multi30k.py",
     "text = unicodedata.normalize(\"NFC\", line).strip()", "text = line.strip()", PIPELINE),
    ("a search error counted where the model prefers its output", "lib/evaluate/evaluation.py",
     "r.score > f.score + 1e-4", "r.score < f.score + 1e-4", PIPELINE),
    ("the worst samples taken from the best", "lib/evaluate/evaluation.py",
     "rank(method=\"first\").lt(", "rank(method=\"first\", ascending=False).lt(", PIPELINE),
    ("an LM's validation loss without the tail block", "lib/evaluate/evaluation.py",
     "if targets % block_size:", "if False:", PIPELINE),
    ("bits per character counted per token", "lib/evaluate/evaluation.py",
     "/ (n_chars / n_tokens)}", "}", PIPELINE),
    ("a stage's --out=~/data written to a directory named ~", "lib/stage/cli.py",
     "required=True, type=os.path.expanduser,\n                            help=f\"path of the {kind} written",
     "required=True,\n                            help=f\"path of the {kind} written", PIPELINE),
    ("a stage's --data=~/data read from a directory named ~", "lib/stage/cli.py",
     "required=True, type=os.path.expanduser,\n                            help=\"path to read",
     "required=True,\n                            help=\"path to read", PIPELINE),
    ("a stage's output let be another of its paths (tokenize --out naming its --data)", "lib/stage/cli.py",
     "if name != out and (how := placed(path, paths[out])):", "if False:", PIPELINE),
    ("a stage's output refused only where it is another path, not where it holds one", "lib/stage/cli.py",
     "if name != out and (how := placed(path, paths[out])):",
     "if name != out and (how := placed(path, paths[out])) == \"is\":", PIPELINE),
    ("paths compared by name, not by the files their links lead to (a stage's outputs, generate's)",
     "lib/core/files.py", "real, held = os.path.realpath(path), os.path.realpath(within)",
     "real, held = os.path.abspath(path), os.path.abspath(within)", PIPELINE),
    ("a WORLD_SIZE torchrun did not set let through to torch's rendezvous (a KeyError, or a wait for ever)",
     "lib/stage/cli.py", "        check_launch(stage)\n        check_apart(", "        check_apart(", PIPELINE),
    ("another listed task's misspelt name left to dvc (cumsum's prepare ran, then 'No such file: .../multi30K.py')",
     "lib/tasks/params.py", "    for name in tasks:\n        get_task(name)", "    for name in tasks[:0]:\n"
     "        get_task(name)", PIPELINE + ["tests/test_report_page.py"]),
    ("a local rank beyond the machine's GPUs let through to CUDA's \"invalid device ordinal\"", "lib/core/distributed.py",
     "if not local.isdigit() or int(local) >= count:", "if not local.isdigit():", PIPELINE),
    ("a stage other than train let run under torchrun (two prepare processes raced to one temporary directory)",
     "lib/stage/cli.py", "if stage not in PARALLEL:", "if False:", PIPELINE),
    ("a RANK at or beyond WORLD_SIZE let through to torch's rendezvous, which waits for ever", "lib/stage/cli.py",
     "or int(rank) >= int(world):", ":", PIPELINE),
    ("a WORLD_SIZE without torchrun's RANK, MASTER_ADDR and MASTER_PORT not named", "lib/stage/cli.py",
     "if missing := [name for name in LAUNCH if not os.environ.get(name)]:", "if missing := []:", PIPELINE),
    ("a WORLD_SIZE that is no number read with int() while the stage says why it stops (a traceback)", "lib/stage/cli.py",
     "return int(world) if world.isdigit() else 1", "return int(world)", PIPELINE),
    ("a stage's output let be in a directory it reads (evaluate --samples data/cumsum/test.parquet)", "lib/stage/cli.py",
     "if name not in writes and INPUTS.get(name, (FILE,))[0] == DIRECTORY and placed(paths[out], path):",
     "if False:", PIPELINE),
    ("a stage's output in a directory it reads refused only where it is that directory", "lib/stage/cli.py",
     "== DIRECTORY and placed(paths[out], path):", "== DIRECTORY and placed(paths[out], path) == \"is\":", PIPELINE),
    ("a directory replaced whole over what its writer does not write (an export over a user's folder)",
     "lib/core/files.py", "    check_replaceable(path, holds, writer=writer)\n", "",
     PIPELINE),
    ("a stage's directory output holding files it does not write let through, only directories refused",
     "lib/core/files.py", "if not any(fnmatchcase(entry.name, pattern) for pattern in holds))",
     "if entry.is_dir() and not any(fnmatchcase(entry.name, pattern) for pattern in holds))", PIPELINE),
    ("prepare's text splits (the LM's train.txt, valid.txt) taken for what it does not write", "lib/tasks/base.py",
     "prepared = (\"train.txt\", \"valid.txt\")", "prepared = SPLIT_FILES", PIPELINE),
    ("prepare's directory let hold any text or parquet file (a text source copied in, lost with it)", "lib/tasks/outputs.py",
     "return task.prepared if (stage, option) == (\"prepare\", \"out\") else HOLDS[stage, option]",
     "return (\"*.parquet\", \"*.txt\", \"*.json\") if (stage, option) == (\"prepare\", \"out\") else HOLDS[stage, option]",
     PIPELINE),
    ("cumsum's alphabet read unchecked (a missing one: Python's Errno 2)", "lib/tasks/cumsum.py",
     "    check_readable(alphabet_path, writer=\"prepare\")\n", "", PIPELINE),
    ("cumsum's training sequences not kept out of valid and test", "lib/tasks/cumsum.py",
     "if digits not in held_out:", "if True:", USER),
    ("cumsum's length study drawing training sequences", "lib/tasks/cumsum.py",
     "if digits not in train:", "if True:", USER),
    ("cumsum's modulus ignored", "lib/tasks/cumsum.py",
     "out.append(total % modulus if modulus else total)", "out.append(total)", USER),
    ("cumsum's vocabulary without the sums training never reaches", "lib/tasks/cumsum.py",
     "train[\"tgt\"].tolist() + [alphabet]", "train[\"tgt\"].tolist()", USER),
    ("token accuracy over the output's tokens, not the reference's", "lib/tasks/cumsum.py",
     "total += len(r_tokens)", "total += len(h_tokens)", USER),
    ("exact_up_to_length stopped by lengths shorter than any trained", "lib/tasks/cumsum.py",
     "if length < shortest:\n            continue", "if False:\n            continue", USER),
    ("the LM validated on its training text", "lib/tasks/shakespeare.py",
     "write_text(text[cut:], encoding", "write_text(text[:cut], encoding", USER),
    ("the source's <eos> not added (tokenize.source_eos ignored)", "lib/data/tokenizer.py",
     "    if cfg.source_eos:\n        eos", "    if False:\n        eos", USER),
    ("adjacent unknown characters named one by one", "lib/data/tokenizer.py",
     "if spans and spans[-1][1] == start:", "if False:", USER),
    ("a stream's pieces decoded without the text before them", "lib/data/tokenizer.py",
     "start = max(0, given - context)", "start = given", USER),
    ("the searches ignoring the sources' padding", "transformer/greedy.py",
     "src_mask = padding_mask(src, ids.pad)  # (B, 1, 1, S)", "src_mask = padding_mask(src, -1)  # (B, 1, 1, S)",
     USER),
    ("beam search starting every beam alike", "transformer/beam.py",
     "live[:, 0] = 0.0", "live[:, :] = 0.0", USER),
    ("beam search's cache not following the surviving beams", "transformer/beam.py",
     "            decoder.select(rows)\n", "            pass\n", USER),
    ("outputs not capped at the model's max_len", "transformer/greedy.py",
     "max_new_tokens.clamp(max=model.cfg.max_len - 1)", "max_new_tokens", USER),
    ("an output's eos kept among its tokens", "transformer/greedy.py",
     "if token in (ids.eos, ids.pad):", "if token == ids.pad:", USER),
    ("a given output's eos left out of its score", "transformer/greedy.py",
     "log_probs[row, :len(outputs[i]) + eos[i]]", "log_probs[row, :len(outputs[i])]", USER),
    ("sampling without the temperature", "transformer/greedy.py",
     "(logits - logits.max()) / divisor", "(logits - logits.max())", USER),
    ("sampling past the block reading the text's first block", "transformer/greedy.py",
     "logits = model(ids[:, -block_size:])[0, -1]", "logits = model(ids[:, :block_size])[0, -1]", USER),
    ("input not NFC-normalised as the data was", "lib/use/lines.py",
     "unicodedata.normalize(\"NFC\", line).strip()", "line.strip()", USER),
    ("evaluate's alpha checked only by the search, after the losses, unnamed", "lib/evaluate/evaluation.py",
     "        check_alpha(model, cfg.alpha, f\"{task}.evaluate.alpha\")\n", "        pass\n", USER),
    ("generate's --alpha checked only once a line is read, unnamed", "lib/use/families.py",
     "        check_alpha(model, args.alpha, \"--alpha\")  #", "        pass  #", USER),
    ("an evaluate prompt read as <unk> without a word", "lib/evaluate/evaluation.py", "            log.warning(message)\n",
     "            pass\n", USER),
    ("a source of exactly max_len tokens refused", "lib/use/inference.py",
     "if len(encoding.ids) > model.cfg.max_len:", "if len(encoding.ids) >= model.cfg.max_len:", USER),
    ("least_likely naming the likeliest token", "lib/use/inference.py",
     "j = min(range(len(h.token_log_probs))", "j = max(range(len(h.token_log_probs))", USER),
    ("an output's token count without its eos", "lib/use/inference.py",
     "len(h.tokens) + h.eos, h.eos,", "len(h.tokens), h.eos,", USER),
    ("beam search's errors judged without its length penalty", "lib/evaluate/evaluation.py",
     "[r.with_alpha(alpha) for r in scored_references]", "scored_references", USER),
    ("one sample too many marked first", "lib/evaluate/evaluation.py",
     "first=test.index < cfg.n_samples", "first=test.index <= cfg.n_samples", USER),
    ("FLOPs counted without cross attention", "lib/model/hardware.py", "    if src_lengths:  # cross",
     "    if False:  # cross", USER),
    ("FLOPs of the forward pass alone", "lib/model/hardware.py", "return 3 * 2 * macs", "return 2 * macs", USER),
    ("a stalled run's caption at half ln V", "lib/report/captions.py",
     "if end < 0.9 * uniform:", "if end < 0.5 * uniform:", USER),
    ("BLEU by length putting a sentence in the next group", "lib/tasks/multi30k.py",
     "if words <= high:", "if words < high:", USER),
    ("multi30k.fetch.source ~/raw taken for a hub data set's name", "lib/tasks/multi30k.py",
     "object.__setattr__(self, \"source\", os.path.expanduser(self.source))", "pass", USER),
    ("shakespeare.fetch.source ~/input.txt looked for in a directory named ~", "lib/tasks/shakespeare.py",
     "object.__setattr__(self, \"source\", os.path.expanduser(self.source))", "pass", USER),
    ("load(\"~/models\") looking in a directory named ~", "lib/model/checkpoint.py",
     "directory = Path(directory).expanduser()", "directory = Path(directory)", USER),
    ("generate's --output let replace the --input or --score file it reads", "lib/use/generate.py",
     "if path and \"-\" not in (path, args.output) and replaces(args.output, path)]", "if False]", USER),
    ("generate's --output - (stdout) taken for a file named - that the input reads as ./-", "lib/use/generate.py",
     "if path and \"-\" not in (path, args.output) and", "if path and path != \"-\" and", USER),
    ("generate's --output compared with the inputs by name, not by the file its links lead to", "lib/use/generate.py",
     "files.placed(output, path) == \"is\"", "output == path", USER),
    ("generate's --output refused where a hard link to the input, which it leaves, is named", "lib/use/generate.py",
     "files.placed(output, path) == \"is\"", "os.path.samefile(output, path)", USER),
    ("generate's --output=~/out.txt written under a directory named ~", "lib/use/generate.py",
     "parser.add_argument(\"--output\", default=\"-\", type=os.path.expanduser,",
     "parser.add_argument(\"--output\", default=\"-\",", USER),
    ("generate's --output let replace the model.pt it loads, --attention draw into tokenizer/", "lib/use/generate.py",
     "for name, stage in MODEL_FILES.items() if (how := files.placed(path, directory / name))]",
     "for name, stage in MODEL_FILES.items() if False]", USER),
    ("generate's outputs let go inside tokenizer/ and checkpoints/, only the paths themselves refused",
     "lib/core/files.py",
     "\"is in\" if os.path.commonpath([real, held]) == held else", "\"is in\" if False else", USER),
    ("generate's outputs let go into the tokenizer the pipeline wrote", "lib/use/generate.py",
     "\"tokenizer\": \"tokenize\", ", "", USER),
    ("generate's unknown --task named as the params' tasks list, not as the option", "lib/use/generate.py",
     "required=True, choices=task_names(),", "required=True,", USER),
    ("generate's --attention let be its --output (the figures made, then the output lost)", "lib/use/generate.py",
     "        if how := files.placed(args.attention, args.output):", "        if False:", USER),
    ("generate's --attention let be under its --output, only the same path refused", "lib/use/generate.py",
     "if how := files.placed(args.attention, args.output):",
     "if (how := files.placed(args.attention, args.output)) == \"is\":", USER),
    ("a models directory holding neither model.pt nor tokenizer/ told to run the tokenize stage",
     "lib/model/checkpoint.py",
     "    if not (directory / \"model.pt\").exists() and not (directory / \"tokenizer\").exists():",
     "    if False:", USER),
    ("a models directory lacking either model.pt or tokenizer/ called the wrong directory, not told the stage to run",
     "lib/model/checkpoint.py", "if not (directory / \"model.pt\").exists() and not (directory / \"tokenizer\")",
     "if not (directory / \"model.pt\").exists() or not (directory / \"tokenizer\")", USER),
    ("generate's figures of an earlier run left in --attention beside the new ones", "lib/use/attention_figures.py",
     "if path.name not in drawn and not path.is_dir() and is_a_figure(path.name):", "if False:", USER),
    ("generate's redrawn --attention losing every earlier file, not only figures", "lib/use/attention_figures.py",
     "not path.is_dir() and is_a_figure(path.name):", "not path.is_dir():", USER),
    ("generate's redrawn --attention losing the figures it has just drawn", "lib/use/attention_figures.py",
     "if path.name not in drawn and not path.is_dir()", "if not path.is_dir()", USER),
    ("generate's --output let take a figure's name in --attention (--output figs/attention.md replaced the index)",
     "lib/use/generate.py", "elif takes_a_figure(args.output, args.attention):", "elif False:", USER),
    ("generate's --output by a figure's name in --attention refused, but not a link leading there", "lib/use/generate.py",
     "for path in (output, os.path.realpath(output)))", "for path in (output,))", USER),
    ("generate's --output refused anywhere in --attention, not only by a figure's name", "lib/use/generate.py",
     "and is_a_figure(Path(path).name)", "", USER),
    ("generate's --output by a line's figure name let replace it in --attention", "lib/use/attention_figures.py",
     ", \"*_attention_line*.png\")", ")", USER),
]


def copy_tree(dest: Path):
    """The working tree as it is, without what a mutation cannot touch."""
    if dest.exists():
        shutil.rmtree(dest)
    outputs = {".git", ".venv", ".dvc", "data", "models", "reports", "sources", "exports"}  # at the top only: lib/data

    def ignore(directory: str, names: list[str]) -> set[str]:
        top = Path(directory) == ROOT
        return {name for name in names if (top and name in outputs) or name in ("__pycache__", ".pytest_cache")}

    shutil.copytree(ROOT, dest, ignore=ignore)


def mutated(text: str, old: str, new: str) -> str | None:
    """``text`` with the mistake planted, or None where the mutation is stale: ``old`` is not in ``text`` exactly
    once, or ``new`` plants nothing."""
    return text.replace(old, new) if text.count(old) == 1 and new != old else None


SOURCES = ("lib", "transformer", "stages")  # where a mutation's text is looked for when its file no longer holds it


def locate(root: Path, path: str, old: str) -> str | None:
    """The file under ``root`` to mutate: ``path`` when it holds ``old`` exactly once, else the one source file
    that does; None when there is none (or several)."""
    if (root / path).is_file() and (root / path).read_text(encoding="utf-8").count(old) == 1:
        return path
    holders = [str(file.relative_to(root)) for package in SOURCES for file in sorted((root / package).rglob("*.py"))
               if file.read_text(encoding="utf-8").count(old) == 1]
    return holders[0] if len(holders) == 1 else None


def run(what: str, path: str, old: str, new: str, tests: list[str], tree: Path) -> dict:
    copy_tree(tree)
    found = locate(tree, path, old)
    if found is None or old == new:
        return {"mutation": what, "file": path, "result": "stale"}
    path, source = found, tree / found
    text = source.read_text(encoding="utf-8")
    mutant = mutated(text, old, new)
    source.write_text(mutant, encoding="utf-8")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests], cwd=tree,
                          capture_output=True, text=True)
    failed = [line.split(" ")[1] for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    if done.returncode not in (0, 1):  # pytest's 1: tests failed; else it could not run them (an import, say)
        return {"mutation": what, "file": path, "result": "broken", "output": done.stdout[-600:] + done.stderr[-600:]}
    return {"mutation": what, "file": path, "result": "killed" if done.returncode else "survived",
            "by": failed[:1], "seconds": round(time.perf_counter() - start, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=[], help="run the mutations whose description holds one of these")
    parser.add_argument("--family", choices=("numeric", "training", "pipeline", "user"),
                        help="only the mutations that run this family's tests (NUMERIC, TRAINING, ... above)")
    parser.add_argument("--workdir", default=None, help="where the mutated copy goes (default: a temporary directory)")
    parser.add_argument("--check", action="store_true", help="only list the stale mutations (seconds, no tests run)")
    args = parser.parse_args()
    families = {"numeric": NUMERIC, "training": TRAINING, "pipeline": PIPELINE, "user": USER}
    chosen = [m for m in MUTATIONS if (not args.only or any(s in m[0] for s in args.only))
              and (not args.family or m[4] is families[args.family])]
    if not chosen:
        parser.error(f"--only {' '.join(args.only)}: no mutation's description holds it")
    if len({what for what, *_ in MUTATIONS}) != len(MUTATIONS):
        parser.error("two mutations share a description, by which --only picks them")
    if args.check:
        stale = [what for what, path, old, new, _ in chosen if old == new or locate(ROOT, path, old) is None]
        print(json.dumps({"mutations": len(chosen), "stale": stale}))
        return 1 if stale else 0
    if args.workdir:  # made if missing, as the usage line's /tmp/mutants is on a fresh machine
        try:
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"--workdir {args.workdir}: {err.strerror}")
    results = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as scratch:
        for mutation in chosen:
            results.append(run(*mutation, Path(scratch) / "tree"))
            print(json.dumps(results[-1]), flush=True)
    counts = {k: sum(r["result"] == k for r in results) for k in ("killed", "survived", "stale", "broken")}
    print(json.dumps({"mutations": len(results), **counts,
                      "survivors": [r["mutation"] for r in results if r["result"] == "survived"]}))
    return 1 if counts["survived"] or counts["stale"] or counts["broken"] else 0


if __name__ == "__main__":
    sys.exit(main())

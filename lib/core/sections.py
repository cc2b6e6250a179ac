"""The stages' sections of params.yaml as frozen dataclasses (lib.core.config reads them): tokenize, train and
evaluate and report for each model family, each checking its own values."""

import dataclasses
from pathlib import PurePosixPath

from lib.core.config import check_seed
from lib.core.options import within_schema
from transformer.config import ModelConfig, choose, require


INIT_DIR = "init"  # where a run's starting weights sit: dvc.yaml's train stage depends on the folder


def check_init_from(init_from: str | None):
    require(init_from is None or (isinstance(init_from, str) and PurePosixPath(init_from).parts[:1] == (INIT_DIR,)
                                  and ".." not in PurePosixPath(init_from).parts), "init_from",
            f"{init_from!r} is not under {INIT_DIR}/, the folder dvc.yaml's train stage depends on: copy the "
            f"trained model there (cp -r models/<task> {INIT_DIR}/<name>) and name that")


def check_peak(peak_tflops: float | str):
    require(peak_tflops == "measure" or isinstance(peak_tflops, float) and peak_tflops >= 0, "peak_tflops",
            f"{peak_tflops!r} is neither a number >= 0 nor 'measure'")


# bf16 pays off where the CPU multiplies bfloat16 natively (AMX, AVX512-BF16) and on GPUs; auto picks it
# there, and fp32 elsewhere (training.resolve_precision).
PRECISIONS = ("fp32", "bf16", "auto")


@dataclasses.dataclass(frozen=True)
class TokenizeConfig:
    kind: str  # word (whitespace-separated words), char (every character) or bpe (byte-pair merges)
    min_frequency: int  # drop words, characters or merges seen fewer times in the training split
    vocab_size: int = 0  # bpe only: the vocabulary's size, special tokens included
    joint: bool = True  # parallel tasks: one vocabulary for both languages; False: one per side
    split_punctuation: bool = False  # bpe only: punctuation is its own piece ("▁dog" "."), never merged into a word
    source_eos: bool = False  # parallel tasks: every source ends in <eos>, marking for the decoder where it ends

    def __post_init__(self):
        choose(self.kind, "kind", ("word", "char", "bpe"))
        require(self.min_frequency >= 1, "min_frequency", "must be >= 1")
        if self.kind == "bpe":
            require(self.vocab_size > 4, "vocab_size", "bpe needs a vocab_size above the 4 special tokens")
        else:  # a word or char vocabulary holds every symbol seen min_frequency times: no size to set
            require(self.vocab_size == 0, "vocab_size", f"applies to kind: bpe only, not {self.kind}")
            require(not self.split_punctuation, "split_punctuation", f"applies to kind: bpe only, not {self.kind}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seed: int  # seeds weights, dropout and batch order
    device: str  # auto (CUDA when present, else MPS on Apple silicon, else the CPU), cpu, cuda or mps
    epochs: int  # passes over the training split, at most
    max_tokens: int  # token budget of a batch, a side: sentences x longest padded side (see batch_unit)
    lr_factor: float  # Noam factor
    warmup: int  # Noam warmup steps: the learning rate peaks here
    label_smoothing: float  # mass spread over the non-gold, non-pad vocabulary
    clip_norm: float  # gradient-norm clipping threshold; 0: no clipping (the paper's)
    checkpoint_every: int  # steps between resumable checkpoints
    model: ModelConfig
    precision: str = "fp32"  # fp32; bf16 (autocast: matmuls in bfloat16, weights and loss in float32); or auto:
    # bf16 on a GPU or a CPU that multiplies bfloat16 natively (AVX512-BF16, AMX), fp32 elsewhere
    max_steps: int = 0  # stop at this many optimizer steps, mid-epoch if need be (the paper's unit, sec. 5.3);
    # 0 = none. Raising it continues a stopped run
    time_budget_minutes: float = 0.0  # stop after the epoch that passes this much training time (with a cooldown:
    # at the budget's end, mid-epoch); 0 = none
    cooldown: float = 0.0  # the last share of the run over which the rate falls linearly from Noam's to 0, toward
    # the nearer end: train.epochs' (or max_steps') last step, or the time budget's end. 0: Noam alone (the paper)
    patience: int = 0  # stop after this many epochs without a better validation loss; 0 = never
    average_last: int = 1  # model.pt: the average of the last k epochs' weights (see ``average``)
    average_every: int = 0  # N > 0: average instead the last k weights saved every N steps (the paper's
    # checkpoints every 10 minutes, sec. 6.1: an epoch of a large corpus is too long a unit), the last of them
    # at max_steps when it is set
    average: str = "if_better"  # if_better: model.pt is the average when it validates better than the best
    # single weights, else those; always: the average, as the paper does
    too_long: str = "fail"  # a train or valid pair longer than model.max_len: fail (naming the key) or skip (counted
    # in the log). The splits evaluate decodes (test, cumsum's length study) must fit whole: train checks them first
    accumulate: int = 1  # batches whose gradients add up to one optimizer step (gradient accumulation): the
    # update of a batch k times the size, in the memory of one; epochs then have 1/k the steps
    batch_unit: str = "padded"  # what max_tokens counts: padded (sentences x the longest side) or real (the
    # non-pad tokens of each side, as the paper counts its 25,000)
    peak_tflops: float | str = 0.0  # the hardware's peak TFLOP/s, for model FLOPs utilisation (train/mfu):
    # a datasheet figure, "measure" (square matmuls in train.precision, timed when training starts), or 0: none
    compile: bool = False  # torch.compile the training step's model and loss: fused element-wise kernels on a GPU
    # (a minute or two of compiling when training starts); on a CPU it is slower than eager
    fast: bool = True  # true: train with transformer.fast's modules and fused loss; false: the reference forms
    log_every: int = 1  # read each step's loss and gradient norm back from the device every N steps, in one wait:
    # on a GPU the host queues the next steps meanwhile (1: every step). Always before weights are saved
    valid_score: bool = True  # after each epoch, the task's score of the greedy valid outputs (cumsum: exact
    # match; multi30k: BLEU), logged as valid/<score>; false: skip its decoding time
    init_from: str | None = None  # start from trained weights (fine-tuning): a folder under init/ holding model.pt
    # and tokenizer/ (a copy of models/<task>) or an export; the same model params and tokenizer. null: random

    def __post_init__(self):
        check_seed(self.seed)
        check_init_from(self.init_from)
        choose(self.device, "device", ("auto", "cpu", "cuda", "mps"))
        choose(self.precision, "precision", PRECISIONS)
        choose(self.too_long, "too_long", ("fail", "skip"))
        choose(self.average, "average", ("if_better", "always"))
        choose(self.batch_unit, "batch_unit", ("padded", "real"))
        for name in ("epochs", "max_tokens", "warmup", "checkpoint_every", "average_last", "accumulate", "log_every"):
            require(getattr(self, name) > 0, name, "must be > 0")
        require(self.max_steps >= 0, "max_steps", "must be >= 0 (0: no bound but train.epochs)")
        require(self.time_budget_minutes >= 0, "time_budget_minutes", "must be >= 0")
        require(self.patience >= 0, "patience", "must be >= 0")
        require(0 <= self.cooldown <= 1, "cooldown", "must be in [0, 1] (a share of the run; 0: none)")
        require(self.average_every >= 0, "average_every", "must be >= 0 (0: average by epochs)")
        check_peak(self.peak_tflops)
        require(self.lr_factor > 0, "lr_factor", "must be > 0")
        require(self.clip_norm >= 0, "clip_norm", "must be >= 0 (0: no clipping)")
        require(0.0 <= self.label_smoothing < 1.0, "label_smoothing", "must be in [0, 1)")


@dataclasses.dataclass(frozen=True)
class LMTrainConfig:
    seed: int  # seeds weights, dropout and the blocks drawn
    device: str  # auto (CUDA when present, else MPS on Apple silicon, else the CPU), cpu, cuda or mps
    max_iters: int  # optimizer steps
    batch_size: int  # blocks per step
    block_size: int  # tokens of context per block (at most model.max_len)
    schedule: str  # cosine (linear warmup, then cosine decay to min_lr) or noam
    lr: float  # peak learning rate, reached at the end of warmup (both schedules)
    min_lr: float  # cosine: the rate at max_iters
    warmup: int  # steps of linear warmup
    weight_decay: float  # AdamW decay of weight matrices (never biases, LayerNorm or embeddings)
    beta2: float  # AdamW's second-moment decay
    clip_norm: float  # gradient-norm clipping threshold; 0: no clipping
    eval_every: int  # steps between estimates of train and validation loss
    eval_batches: int  # fixed batches each estimate averages over
    checkpoint_every: int  # steps between resumable checkpoints
    model: ModelConfig
    precision: str = "fp32"  # fp32; bf16 (autocast: matmuls in bfloat16, weights and loss in float32); or auto:
    # bf16 on a GPU or a CPU that multiplies bfloat16 natively (AVX512-BF16, AMX), fp32 elsewhere
    peak_tflops: float | str = 0.0  # the hardware's peak TFLOP/s, for model FLOPs utilisation (train/mfu):
    # a datasheet figure, "measure" (square matmuls in train.precision, timed when training starts), or 0: none
    compile: bool = False  # torch.compile the training forward pass: fused element-wise kernels on a GPU
    # (a minute or two of compiling when training starts); on a CPU it is slower than eager
    fast: bool = True  # true: train with transformer.fast's modules; false: the reference forms
    accumulate: int = 1  # batches of batch_size blocks whose gradients add up to one optimizer step (gradient
    # accumulation): the update of k * batch_size blocks in the memory of batch_size
    init_from: str | None = None  # start from trained weights (fine-tuning): a folder under init/ holding model.pt
    # and tokenizer/ (a copy of models/<task>) or an export; the same model params and tokenizer. null: random

    def __post_init__(self):
        check_seed(self.seed)
        check_init_from(self.init_from)
        choose(self.device, "device", ("auto", "cpu", "cuda", "mps"))
        choose(self.precision, "precision", PRECISIONS)
        choose(self.schedule, "schedule", ("cosine", "noam"))
        for name in ("max_iters", "batch_size", "block_size", "warmup", "eval_every", "eval_batches",
                     "checkpoint_every", "accumulate"):
            require(getattr(self, name) > 0, name, "must be > 0")
        require(self.lr > 0, "lr", "must be > 0")
        require(0 <= self.min_lr <= self.lr, "min_lr", "must be in [0, lr]")
        require(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        require(0 < self.beta2 < 1, "beta2", "must be in (0, 1)")
        check_peak(self.peak_tflops)
        require(self.clip_norm >= 0, "clip_norm", "must be >= 0 (0: no clipping)")
        require(self.block_size <= self.model.max_len, "block_size", f"exceeds model.max_len {self.model.max_len}")


@dataclasses.dataclass(frozen=True)
class LMEvaluateConfig:
    prompts: tuple[str, ...]  # each starts one sample
    max_new_tokens: int  # tokens sampled after each prompt
    temperature: float  # divides the logits: < 1 sharper, > 1 flatter
    top_k: int  # sample among the k likeliest tokens; 0 = all
    seed: int  # same seed, same samples
    top_p: float = 1.0  # sample among the likeliest tokens whose probabilities reach p (nucleus); 1 = all

    def __post_init__(self):
        require(len(self.prompts) > 0, "prompts", "needs at least one prompt")
        require(all(self.prompts), "prompts", "an empty prompt leaves the model nothing to continue")
        within_schema(self, ("max_new_tokens", "temperature", "top_k", "seed", "top_p"))


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    max_tokens: int  # token budget of a batch, for the loss and for decoding
    max_extra_tokens: int  # a hypothesis has at most source length + this many tokens (eos included)
    n_samples: int  # the report's example tables: the first n test examples and the worst n
    beam_size: int = 1  # > 1: also decode with beam search of this width (1: greedy only)
    alpha: float = 0.6  # beam search's length penalty ((5 + length) / 6) ** alpha; 0 = none
    device: str = "auto"  # where the model decodes and scores: auto (the GPU when there is one), cpu, cuda or mps

    def __post_init__(self):
        within_schema(self, ("max_tokens", "max_extra_tokens", "beam_size", "alpha"))
        require(self.n_samples > 0, "n_samples", "must be > 0")
        choose(self.device, "device", ("auto", "cpu", "cuda", "mps"))


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    n_attention_examples: int  # test examples drawn as attention heatmaps

    def __post_init__(self):
        require(self.n_attention_examples > 0, "n_attention_examples", "must be > 0")


@dataclasses.dataclass(frozen=True)
class LMReportConfig:
    passage_tokens: int  # length of the validation passage drawn as self-attention heatmaps (<= train.block_size)

    def __post_init__(self):
        require(self.passage_tokens > 1, "passage_tokens", "must be > 1")

"""The model families as the train stage sees them (lib.core.families says why each layer has its own): the
loop that trains a family's model, what its model reads, and what model.pt records of the run."""

from pathlib import Path

from lib.train.lm import train_lm
from lib.train.seq2seq import train_seq2seq
from transformer.masks import padding_mask, target_mask


class TrainFamily:
    name = ""  # as model.pt records it

    def train(self, task: str, cfg, data_dir, tokenizer_dir, model_path, checkpoint_dir: Path, live_dir) -> dict:
        """The family's loop, to model.pt; returns the final metrics."""
        raise NotImplementedError

    def logits(self, model, tokens, given, pad: int):
        """The model's outputs for the ``given`` target tokens, any other input it reads drawn by ``tokens``."""
        raise NotImplementedError

    def recorded(self, cfg) -> dict:
        """What model.pt records of the train params, for the report (beside what every run records)."""
        return {}

    def batch(self, cfg) -> str:
        """What sizes a step's batch, as a message about memory names it, and how to halve it."""
        raise NotImplementedError


class Seq2SeqTraining(TrainFamily):
    name = "seq2seq"

    def train(self, task, cfg, data_dir, tokenizer_dir, model_path, checkpoint_dir, live_dir) -> dict:
        return train_seq2seq(task, cfg, data_dir, tokenizer_dir, model_path, checkpoint_dir, live_dir, self)

    def logits(self, model, tokens, given, pad: int):
        src = tokens(model.src_embed.tokens.num_embeddings)
        return model(src, given, padding_mask(src, pad), target_mask(given, pad))

    def recorded(self, cfg) -> dict:
        return {"label_smoothing": cfg.label_smoothing}  # the least loss it lets training reach

    def batch(self, cfg) -> str:
        return f"train.max_tokens {cfg.max_tokens} padded tokens a side; halve it"


class LMTraining(TrainFamily):
    name = "lm"

    def train(self, task, cfg, data_dir, tokenizer_dir, model_path, checkpoint_dir, live_dir) -> dict:
        return train_lm(task, cfg, data_dir, tokenizer_dir, model_path, checkpoint_dir, live_dir, self)

    def logits(self, model, tokens, given, pad: int):
        return model(given)

    def batch(self, cfg) -> str:
        return f"train.batch_size {cfg.batch_size} blocks of train.block_size {cfg.block_size} tokens; halve batch_size"


TRAINING = {family.name: family for family in (Seq2SeqTraining(), LMTraining())}

"""The model families as the report sees them (lib.core.families says why each layer has its own): the samples
it reads, how it describes the model, the sections after the training curves and the attention view."""

from pathlib import Path

import pandas as pd

from lib.core.config import ConfigError
from lib.data.pairs import read_text
from lib.report.attention_view import lm_view, seq2seq_view
from lib.report.sections import dropped_section, lm_sections, seq2seq_sections


class ReportFamily:
    name = ""  # as model.pt records it
    sample_keys: tuple[str, ...] = ()  # what the report reads of each row of samples.jsonl
    tokens = "tokens"  # what a training rate counts

    def shape(self, cfg) -> str:
        """The model's stacks, in a phrase (``cfg``: its ModelConfig)."""
        raise NotImplementedError

    def vocabulary(self, state: dict) -> tuple[str, str]:
        """Its vocabulary, and what one tied matrix serves (model.pt's ``state``), in phrases."""
        raise NotImplementedError

    def check(self, cfg, state: dict):
        """The report params against the trained model, before anything is drawn."""

    def data_sections(self, data_dir: Path, state: dict, metrics: dict) -> list[str]:
        """Sections after the metrics: what the data left out."""
        return []

    def sections(self, chosen, cfg, data_dir: Path, tokenizers, model, metrics: dict, samples: pd.DataFrame,
                 by_length: pd.DataFrame, figures_dir: Path, rel: Path, state: dict) -> list[str]:
        """The sections after the training curves: attention, scores by length, examples."""
        raise NotImplementedError

    def view(self, cfg, data_dir: Path, tokenizers, model, samples: pd.DataFrame) -> dict:
        """report.html's interactive attention view."""
        raise NotImplementedError


class Seq2SeqReport(ReportFamily):
    name = "seq2seq"
    sample_keys = ("split", "source", "reference", "greedy", "correct", "score", "first", "worst")
    tokens = "source and target tokens"

    def shape(self, cfg) -> str:
        return (f"An encoder-decoder of {cfg.encoder_layers} encoder and {cfg.decoder_layers} decoder "
                f"layer{'s' * ((cfg.encoder_layers, cfg.decoder_layers) != (1, 1))}")

    def vocabulary(self, state: dict) -> tuple[str, str]:
        source, target = state["src_vocab_size"], state["tgt_vocab_size"]
        if state["joint_vocab"]:
            return (f"one vocabulary of {target:,} tokens for source and target",
                    ", one matrix for the source embedding, the target embedding and the output layer (tied, sec. 3.4)")
        return (f"vocabularies of {source:,} (source) and {target:,} (target) tokens",
                ", one matrix for the target embedding and the output layer (tied)")

    def data_sections(self, data_dir: Path, state: dict, metrics: dict) -> list[str]:
        return dropped_section(data_dir, state, metrics)

    def sections(self, chosen, cfg, data_dir, tokenizers, model, metrics, samples, by_length, figures_dir, rel,
                 state) -> list[str]:
        return seq2seq_sections(chosen, cfg, data_dir, tokenizers, model, metrics, samples, by_length, figures_dir,
                                rel)

    def view(self, cfg, data_dir, tokenizers, model, samples) -> dict:
        return seq2seq_view(model, tokenizers, samples)


class LMReport(ReportFamily):
    name = "lm"
    sample_keys = ("prompt", "sample")

    def shape(self, cfg) -> str:
        return f"A decoder-only language model of {cfg.decoder_layers} layer{'s' * (cfg.decoder_layers != 1)}"

    def vocabulary(self, state: dict) -> tuple[str, str]:
        return (f"a vocabulary of {state['tgt_vocab_size']:,} tokens",
                ", one matrix for the embedding and the output layer (tied)")

    def check(self, cfg, state: dict):
        if cfg.passage_tokens > state["block_size"]:
            raise ConfigError(f"report.passage_tokens: {cfg.passage_tokens} is longer than the blocks the model "
                              f"was trained on (train.block_size {state['block_size']})")

    def sections(self, chosen, cfg, data_dir, tokenizers, model, metrics, samples, by_length, figures_dir, rel,
                 state) -> list[str]:
        return lm_sections(cfg, data_dir, tokenizers, model, samples, by_length, figures_dir, rel,
                           state["block_size"])

    def view(self, cfg, data_dir, tokenizers, model, samples) -> dict:
        return lm_view(model, tokenizers.target, read_text(data_dir, "valid"), cfg.passage_tokens)


REPORTING = {family.name: family for family in (Seq2SeqReport(), LMReport())}

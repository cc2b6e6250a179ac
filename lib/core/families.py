"""The model families as the params see them: the encoder-decoder that translates (seq2seq) and the decoder-only
language model (lm), one object each. Where the two differ, each layer asks its own registry of family objects
(this one; lib.train.families, lib.evaluate.families, lib.report.families, lib.use.families), keyed by the name
that model.pt records; a third family is one class in each, never an ``if`` in many files (docs/code.md)."""

from lib.core.config import require
from lib.core.sections import (EvaluateConfig, LMEvaluateConfig, LMReportConfig, LMTrainConfig, ReportConfig,
                               TokenizeConfig, TrainConfig)
from transformer.config import largest_alpha


class ParamsFamily:
    """What the params of a family's task are: each stage's config class, and the train params that a message
    about a run's learning rate or length names."""

    name = ""  # as model.pt records it (its "kind")
    title = ""  # a task of the family, in a message
    configs: dict[str, type] = {}  # tokenize, train, evaluate, report: each section's frozen dataclass
    lr_param = ""  # the train param that sets the learning rate
    length_param = ""  # and the one that sets how long it trains

    def check_together(self, task: str, train, evaluate, report):
        """What the later stages' params ask of the model train builds (each None where not checked)."""


class Seq2SeqParams(ParamsFamily):
    name, title = "seq2seq", "translation"
    configs = {"tokenize": TokenizeConfig, "train": TrainConfig, "evaluate": EvaluateConfig, "report": ReportConfig}
    lr_param, length_param = "train.lr_factor", "train.epochs or train.max_steps"

    def check_together(self, task: str, train, evaluate, report):
        if train and evaluate and evaluate.beam_size > 1:  # greedy: no alpha
            longest, most = train.model.max_len, largest_alpha(train.model.max_len)
            require(evaluate.alpha <= most, f"{task}.evaluate.alpha",
                    f"{evaluate.alpha}: the length penalty ((5 + length) / 6) ** alpha overflows float32 at "
                    f"{task}.train.model.max_len {longest} for an alpha above {most:.1f} (GNMT's: 0.6 to 1)")


class LMParams(ParamsFamily):
    name, title = "lm", "a language model"
    configs = {"tokenize": TokenizeConfig, "train": LMTrainConfig, "evaluate": LMEvaluateConfig,
               "report": LMReportConfig}
    lr_param, length_param = "train.lr", "train.max_iters"

    def check_together(self, task: str, train, evaluate, report):
        if train and report:
            require(report.passage_tokens <= train.block_size, f"{task}.report.passage_tokens",
                    f"{report.passage_tokens} is longer than the blocks the model trains on "
                    f"({task}.train.block_size {train.block_size})")


FAMILIES = {family.name: family for family in (Seq2SeqParams(), LMParams())}


def params_family(name: str) -> ParamsFamily:
    return FAMILIES[name]

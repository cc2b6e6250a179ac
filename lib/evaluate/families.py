"""The model families as the evaluate stage sees them (lib.core.families says why each layer has its own): how a
family's model is scored, its samples drawn and its decoding settings written."""

from lib.evaluate.evaluation import EvaluatePaths, evaluate_lm, evaluate_seq2seq
from lib.tasks import get_task


class EvaluateFamily:
    name = ""  # as model.pt records it

    def evaluate(self, task: str, cfg, paths: EvaluatePaths) -> dict:
        """The evaluate stage for a task of the family: metrics.json, samples.jsonl, by_length.csv and
        generation.json; returns the metrics."""
        raise NotImplementedError


class Seq2SeqEvaluation(EvaluateFamily):
    name = "seq2seq"

    def evaluate(self, task, cfg, paths):
        """Greedy (and beam) search on the test split, scored by the task; loss and perplexity beside."""
        return evaluate_seq2seq(task, cfg, paths)


class LMEvaluation(EvaluateFamily):
    name = "lm"

    def evaluate(self, task, cfg, paths):
        """The validation text's loss, bits per character and loss by context length; samples of the prompts."""
        return evaluate_lm(task, cfg, paths)


EVALUATIONS = {family.name: family for family in (Seq2SeqEvaluation(), LMEvaluation())}


def run(task: str, cfg, paths: EvaluatePaths) -> dict:
    """The evaluate stage, for the task's family; with ``paths.generation``, the settings it decoded with
    (generation.json), which a user of the model decodes with by default."""
    return EVALUATIONS[get_task(task).family].evaluate(task, cfg, paths)

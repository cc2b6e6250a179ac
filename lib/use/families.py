"""The model families as a user meets them (lib.core.families says why each layer has its own): the Python API
class, the command line's options and what it runs, the web app's route, options and form, and what an export
format cannot express."""

import argparse
import html

from lib.evaluate.options import family_options
from lib.use.language_model import LanguageModel
from lib.use.sample_cli import continue_prompts, prompts_given, score_text
from lib.use.translate_cli import translate_file, translate_typed, typed
from lib.use.to_transformers import gpt2, marian
from lib.use.translator import Translator
from transformer.decoding import check_alpha


class UseFamily:
    name = ""  # as model.pt records it
    title = ""  # a task of the family, in a message
    pipeline_tag = ""  # the Hugging Face hub's task, in an exported model's card
    route = ""  # the web app's route that runs the model
    options: tuple[str, ...] = ()  # the command line's options (lib.use.command), the schema's and its input
    ranged: tuple[str, ...] = ()  # those checked against the schema's ranges
    steering: tuple[str, ...] = ()  # those that steer generation: an error beside --score, which generates nothing
    served: tuple[str, ...] = ()  # what a request to the web app may set
    ctranslate2 = ""  # why CTranslate2 cannot run the family's models ("": it can)
    transformers = ""  # the `transformers` architecture its export writes (lib.use.to_transformers)
    transformers_use: tuple[str, ...] = ()  # that export's card: the lines that load and run it

    def to_transformers(self, model, ids, generation: dict):
        """The same model as a `transformers` model (``generation``: the evaluate stage's decoding settings)."""
        raise NotImplementedError

    def transformers_refusals(self, cfg, joint_vocab: bool) -> list[str]:
        """What of the family's models its `transformers` architecture cannot express, naming each param."""
        return []

    def api(self, model, tokenizers, state: dict, defaults: dict):
        """The Python API's object over a loaded model (``state``: what model.pt records)."""
        raise NotImplementedError

    def command_errors(self, args: argparse.Namespace) -> list[str]:
        """What is missing or inconsistent among the command line's options for this family."""
        return []

    def run_command(self, args: argparse.Namespace, model, tokenizers, state: dict):
        """python -m lib.use.generate, the options checked and the model loaded."""
        raise NotImplementedError

    def form(self, defaults: dict, most: dict[str, str]) -> str:
        """The served page's form: its input and options, the model's ``defaults`` filled in, at ``most`` each."""
        raise NotImplementedError


class Seq2SeqUse(UseFamily):
    name, title, pipeline_tag, route = "seq2seq", "translation", "translation", "/api/translate"
    options = ("input", *family_options("seq2seq"))
    ranged = tuple(name for name in family_options("seq2seq") if name != "n_best")  # --n-best's bound: --beam-size
    steering = ("beam_size", "max_extra_tokens", "n_best")
    served = family_options("seq2seq", served=True)
    transformers = "Marian"
    transformers_use = (
        "```python", "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        'model = AutoModelForSeq2SeqLM.from_pretrained("path/to/this/folder")',
        'batch = tokenizer(["the source sentence"], return_tensors="pt", padding=True)',
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))", "```", "",
        "`generation_config.json` decodes as the evaluate stage's greedy search. Beam search (`num_beams`) with "
        "`length_penalty` 0 is ours with alpha 0; GNMT's length penalty has no counterpart in `transformers`.")

    def api(self, model, tokenizers, state, defaults):
        return Translator(model, tokenizers, defaults=defaults)

    def to_transformers(self, model, ids, generation):
        return marian(model, ids)

    def transformers_refusals(self, cfg, joint_vocab):
        reasons = []
        if cfg.norm_first:
            reasons.append("model.norm_first true: Marian is Post-LN (a norm after each residual sum)")
        if cfg.positional == "learned":
            reasons.append("model.positional learned: Marian takes sinusoidal positions only")
        if not joint_vocab:
            reasons.append("tokenize.joint false: one tokenizer.json serves both sides of a Marian model "
                           "(separate vocabularies need two)")
        return reasons

    def command_errors(self, args):
        errors = [] if args.input else ["--input is required to translate or score (a file, or - for stdin)"]
        if args.n_best is not None and not 1 <= args.n_best <= args.beam_size:
            errors.append(f"--n-best {args.n_best}: must be in [1, --beam-size {args.beam_size}] (the beam holds "
                          "that many outputs)")
        return errors

    def run_command(self, args, model, tokenizers, state):
        check_alpha(model, args.alpha, "--alpha")  # the bound is the model's: named before any input is read
        (translate_typed if typed(args) else translate_file)(args, model, tokenizers)

    def form(self, defaults, most):
        return ('<form id="ask"><label for="input">Translate</label><br><textarea id="input" rows="3" cols="80" '
                'placeholder="a sentence"></textarea><br>'
                f'<label>beam size <input id="beam_size" type="number" value="{defaults["beam_size"]}" min="1" '
                f'max="{most["beam_size"]}"></label> <button type="submit" id="submit">Run</button></form>')


class LMUse(UseFamily):
    name, title, pipeline_tag, route = "lm", "a language model", "text-generation", "/api/generate"
    options = ("prompt", *family_options("lm"))
    ranged = family_options("lm")
    steering = options
    served = family_options("lm", served=True)
    ctranslate2 = "a decoder-only LM: CTranslate2's Translator runs seq2seq models (this export writes those only)"
    transformers = "GPT-2"
    transformers_use = (
        "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")',
        'ids = tokenizer("ROMEO:", return_tensors="pt").input_ids',
        "print(tokenizer.decode(model.generate(ids, max_new_tokens=100)[0]))", "```", "",
        "`generation_config.json` samples as the evaluate stage does (temperature, top-k, top-p); "
        "`do_sample=False` is greedy search, ours with top_k 1. GPT-2 reads at most the model's max_len tokens.")

    def api(self, model, tokenizers, state, defaults):
        return LanguageModel(model, tokenizers, state["block_size"], defaults)

    def to_transformers(self, model, ids, generation):
        return gpt2(model, ids, generation)

    def transformers_refusals(self, cfg, joint_vocab):
        reasons = []
        if not cfg.norm_first:
            reasons.append("model.norm_first false: GPT-2 is Pre-LN (a norm before each sublayer, one at the end)")
        if cfg.bias:
            reasons.append("model.bias true: GPT-2's lm_head has no bias")
        return reasons

    def command_errors(self, args):
        return [] if args.prompt or args.score else [
            "--prompt is required (and must not be empty) to sample from the LM (- reads it from stdin), or "
            "--score FILE to score a text"]

    def run_command(self, args, model, tokenizers, state):
        lm = self.api(model, tokenizers, state, {})  # the options come checked, on args
        if args.score:
            score_text(args, lm)
        else:
            continue_prompts(args, lm, prompts_given(args))

    def form(self, defaults, most):
        return ('<form id="ask"><label for="input">Continue a text</label><br><textarea id="input" rows="3" '
                f'cols="80" placeholder="a prompt">{html.escape("ROMEO:")}</textarea><br>'
                f'<label>tokens <input id="max_new_tokens" type="number" value="{defaults["max_new_tokens"]}" '
                f'min="1" max="{most["max_new_tokens"]}"></label> <label>temperature <input id="temperature" '
                f'type="number" value="{defaults["temperature"]}" step="0.1" min="0.1"></label> '
                '<button type="submit" id="submit">Run</button></form>')


USES = {family.name: family for family in (Seq2SeqUse(), LMUse())}
EVERY_OPTION = tuple(dict.fromkeys(option for family in USES.values() for option in family.options))

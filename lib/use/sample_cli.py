"""The command line's language model (lib.use.generate, an LM): a prompt continued, from an argument, stdin or
lines as they are typed; a text scored; the attention drawn."""

import argparse
import json
import sys
from pathlib import Path

import torch

from lib.core.text import utf8_text
from lib.data.tokenizer import continuation, lm_ids
from lib.use.attention_figures import draw_lm_attention, write_figures
from lib.use.command import SAMPLE_SEPARATOR
from lib.use.language_model import LanguageModel
from lib.use.textio import read_input, write_text


def lm_tokens(tokenizers, text: str, what: str) -> list[int]:
    """The LM's token ids of ``text``; what it cannot read (<unk>) is named on stderr as part of ``what``."""
    ids, messages = lm_ids(tokenizers, text, what)
    for message in messages:
        print(f"generate: {message}", file=sys.stderr)
    return ids


def score_text(args: argparse.Namespace, lm: LanguageModel):
    """The LM's loss, perplexity and bits per character on the whole of --score, as JSON."""
    text = read_input(args.score)
    ids = lm_tokens(lm.tokenizers, text, "--score")
    scores = lm.score_ids(ids, len(text), f"--score {args.score}")
    if args.attention:
        write_figures(Path(args.attention), lambda figures: draw_lm_attention(lm, ids, figures, "the text"))
    write_text(args.output, json.dumps(scores, indent=2) + "\n")


def continue_prompts(args: argparse.Namespace, lm: LanguageModel, prompts):
    """--num-samples continuations of each of ``prompts`` ((text, what names it) pairs), all drawn from one
    generator seeded by --seed. To stdout, each is shown as it is drawn; an --output file is written whole
    at the end. --attention draws the first sample's."""
    generator, shown = torch.Generator().manual_seed(args.seed), args.output == "-"
    show = (lambda text: write_text("-", text)) if shown else (lambda text: None)
    texts, first = [], None
    for prompt, what in prompts:
        ids = lm_tokens(lm.tokenizers, prompt, what)
        for _ in range(args.num_samples):
            if texts:
                show(SAMPLE_SEPARATOR + "\n")
            show(prompt)
            out, text = list(ids), prompt
            for piece in continuation(lm.tokenizers.target, out, lm.sampled_ids(
                    ids, args.max_new_tokens, args.temperature, args.top_k, args.top_p, generator)):
                show(piece)
                text += piece
            show("\n")
            texts.append(text + "\n")
            first = first or out
    if args.attention and first:
        write_figures(Path(args.attention), lambda figures: draw_lm_attention(
            lm, first, figures, "the prompt and its continuation"))
    if not shown:
        write_text(args.output, (SAMPLE_SEPARATOR + "\n").join(texts))


def prompts_given(args: argparse.Namespace):
    """--prompt's text; with --prompt -, the whole of stdin, or, typed at a terminal, each line as it is
    entered (until Ctrl-D)."""
    if args.prompt != "-":
        yield args.prompt, "the prompt"
    elif not sys.stdin.isatty():
        if not (text := read_input("-")):
            raise ValueError("--prompt -: stdin is empty; the LM continues a text")
        yield text, "--prompt - (stdin)"
    else:
        print("generate: continuing each line as you enter it; Ctrl-D to end", file=sys.stderr)
        for number, raw in enumerate(iter(sys.stdin.buffer.readline, b""), 1):
            if line := utf8_text(raw, "stdin", first_line=number).rstrip("\r\n"):
                yield line, f"line {number}"
            else:
                print(f"generate: line {number}: empty; type a text for the LM to continue", file=sys.stderr)

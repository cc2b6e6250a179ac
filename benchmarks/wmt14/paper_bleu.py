"""The paper's tokenised BLEU in Python (lib.tasks.translation.tokenized_bleu: sacremoses, then sacreBLEU over
the tokens) against the Perl pipeline it reproduces, tensor2tensor's get_ende_bleu.sh: Moses'
replace-unicode-punctuation.perl -l de, tokenizer.perl -l de, compounds split by perl -ple, multi-bleu.perl.

The sample: German captions of Multi30k's test set, each dressed with what separates the tokenizers (German
and English quotes, hyphenated compounds, numbers with commas, ranges and units, abbreviations, &, <, brackets,
an apostrophe, a URL), and as hypotheses the same sentences with some words dropped or swapped. Run from the
repository root with the venv active, the Moses scripts from a checkout of moses-smt/mosesdecoder at the paper's
time (b8de7c352, 2017-05-02; tokenizer.perl splits every final dot since 9fc964da7, 2018-11-07):
    PYTHONPATH=. python benchmarks/wmt14/paper_bleu.py --multi30k /path/to/multi30k --moses /path/to/mosesdecoder
Prints one JSON object: both BLEU figures, and how many sentences each side tokenised alike.
"""

import argparse
import gzip
import json
import random
import re
import subprocess
import tempfile
from pathlib import Path

from lib.tasks.translation import paper_tokens, tokenized_bleu
from tools.results import header

DRESSING = [
    "„{}“, sagte er.", "Er sagte: \"{}\"", "{} (z.B. im Ost-West-Konflikt)", "{} – etwa 1-2 Mal pro Woche.",
    "{}: Es kostet 3,50 € & mehr.", "{} Dr. Müller u.a. kamen um 19 Uhr.", "{} <3", "{} [siehe S. 12]",
    "{} ... oder?", "'{}' ist ein Zitat.", "{} 10.000 km/h, d.h. 2.5%.", "{} Siehe www.example.de/a-b?x=1.",
    "{} Der 3. Oktober ist ein Feiertag.", "{} Sie ist 25-jährig.", "{} Das ist‚ schön‘.", "{} E-Mail-Adresse!",
]


def sample(multi30k: Path, n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` references and their hypotheses (see the module's docstring)."""
    captions = gzip.decompress((multi30k / "test_2016_flickr.de.gz").read_bytes()).decode().splitlines()[:n]
    rng = random.Random(seed)
    references, hypotheses = [], []
    for i, caption in enumerate(captions):
        reference = DRESSING[i % len(DRESSING)].format(caption.rstrip("."))
        words = reference.split()
        for _ in range(rng.randint(0, 2)):  # a word dropped, or two swapped
            j = rng.randrange(len(words))
            if rng.random() < 0.5 and len(words) > 3:
                del words[j]
            else:
                k = rng.randrange(len(words))
                words[j], words[k] = words[k], words[j]
        references.append(reference)
        hypotheses.append(" ".join(words))
    return hypotheses, references


def perl_pipeline(moses: Path, hypotheses: list[str], references: list[str]) -> tuple[float, list[str]]:
    """multi-bleu.perl's BLEU of get_ende_bleu.sh's steps, and the hypotheses' tokens as the Perl side made them."""
    scripts = moses / "scripts"
    work = Path(tempfile.mkdtemp(prefix="paper_bleu_"))
    tokenized = {}
    for name, lines in (("hyp", hypotheses), ("ref", references)):
        text = "".join(line + "\n" for line in lines)
        for script in ("tokenizer/replace-unicode-punctuation.perl", "tokenizer/tokenizer.perl"):
            text = subprocess.run(["perl", scripts / script, "-l", "de", *(["-q"] if "tokenizer.perl" in script
                                                                          else [])],
                                  input=text, capture_output=True, text=True, check=True).stdout
        text = subprocess.run(["perl", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"], input=text,
                              capture_output=True, text=True, check=True).stdout
        (work / name).write_text(text)
        tokenized[name] = text.splitlines()
    out = subprocess.run(["perl", scripts / "generic/multi-bleu.perl", work / "ref"], input=(work / "hyp").read_text(),
                         capture_output=True, text=True, check=True).stdout
    return float(re.match(r"BLEU = ([\d.]+)", out).group(1)), tokenized["hyp"] + tokenized["ref"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multi30k", required=True, type=Path, help="a folder of Multi30k's raw task-1 files")
    parser.add_argument("--moses", required=True, type=Path, help="a checkout of moses-smt/mosesdecoder")
    parser.add_argument("--pairs", type=int, default=400)
    args = parser.parse_args()
    hypotheses, references = sample(args.multi30k, args.pairs)
    perl_bleu, perl_tokens = perl_pipeline(args.moses, hypotheses, references)
    python_tokens = [paper_tokens(text) for text in hypotheses + references]
    python_bleu = tokenized_bleu(hypotheses, references)["tokenized_bleu"]
    differing = [(p, q) for p, q in zip(python_tokens, perl_tokens) if p != q]
    print(json.dumps({**header("paper_bleu"), "pairs": len(references), "python_bleu": round(python_bleu, 2),
                      "perl_multi_bleu": perl_bleu, "equal_to_two_decimals": round(python_bleu, 2) == perl_bleu,
                      "sentences_tokenised_alike": f"{len(python_tokens) - len(differing)}/{len(python_tokens)}",
                      "first_difference": differing[0] if differing else None}, ensure_ascii=False))


if __name__ == "__main__":
    main()

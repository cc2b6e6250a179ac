#!/usr/bin/env bash
# One GPU, about 5 minutes: the CUDA-marked tests, the eager training step against torch.nn.Transformer
# (train_throughput.py, at three batch sizes, each with a profile of a few steps: where a step's time
# goes, and the products' own rate), ours compiled at the train stage's batch (what fusing buys), then
# multi30k trained for a minute in bf16 at d_model 512, eager (COMPILE=1: compiled,
# train.compile; eager again if compiling fails). Ends with one JSON line: tokens/s, model FLOPs
# utilisation (MFU) and the validation loss reached.
#
#   bash tools/gpu_check.sh              # on the GPU machine, from the repository root
#   PEAK_TFLOPS=989 MULTI30K=../shared/data/multi30k bash tools/gpu_check.sh
#
# It runs on the machine's own python and its CUDA build of torch (requirements.txt pins the CPU
# wheel); what else requirements.txt lists and the machine lacks goes into $WORK/site. A GPU machine
# without internet takes a bundle made where pip reaches an index:
#   bash tools/gpu_check.sh bundle .gpu  # here: wheels (for PY_VERSION, default 3.12) + multi30k
#   BUNDLE=.gpu bash tools/gpu_check.sh  # there
#
# Settings (environment): PEAK_TFLOPS, the GPU's dense bf16 peak (H100/H200 SXM: 989); MULTI30K, the
# raw task-1 files; MINUTES of training (1); MAX_TOKENS a batch (32768: a d_model 512 step is then
# ~15 ms of matmuls at 30% of an H100's peak, long enough to hide the launches); D_MODEL (512); LAYERS,
# a side, of the stepped model (3: the multi30k recipe's);
# WORK, a scratch directory (/tmp/gpu_check); COMPILE=1 trains compiled (on an H200 compiling took 3 of
# 2.5 minutes, for 4% more tokens/s: the loss reached then measures nothing);
# DEVICE=cpu MINUTES=0.1 D_MODEL=64 MAX_TOKENS=2048 runs the same steps on a CPU, a dry run of the
# script itself, in seconds: fp32 (bf16 is emulated on most CPUs), two steps, small products for the peak
# and a small stand-in for the base model (its compiled step compiles C++ there: minutes).
set -euo pipefail
PYTHON=${PYTHON:-python3}
WORK=${WORK:-/tmp/gpu_check}

# The requirements this check imports and the running python lacks (torch is the machine's own;
# datasets is only for downloading from the hub, import-linter only for the layers test, pip-tools only for
# `make lock`, transformers only for the transformers export).
missing_requirements() {
  "$PYTHON" - <<'PY'
import importlib.util, re
module = {"pyyaml": "yaml", "pytest-xdist": "xdist"}
def found(name):  # a dotted name (ruamel.yaml) whose parent package is missing raises instead of None
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
for line in open("requirements.txt"):
    req = line.split("#")[0].strip()
    name = re.split(r"[<>=!~ \[]", req)[0].lower()
    if req and name not in ("torch", "datasets", "import-linter", "pip-tools", "transformers") \
            and not found(module.get(name, name)):
        print(req)
PY
}

if [ "${1:-}" = bundle ]; then
  dir=${2:?usage: gpu_check.sh bundle DIR}
  PY_VERSION=${PY_VERSION:-3.12}
  MULTI30K=${MULTI30K:-../shared/data/multi30k}
  mkdir -p "$dir/wheels" "$dir/multi30k"
  cp "$MULTI30K"/* "$dir/multi30k/"
  # dvc (dvclive's engine) needs hydra-core, which needs antlr4-python3-runtime: published as source
  # only, and pure Python, so built into a wheel here; all else is downloaded as built wheels.
  "$PYTHON" -m pip wheel -q --no-deps -w "$dir/wheels" "antlr4-python3-runtime==4.9.*"
  platforms=()
  for p in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${p}_x86_64")
  done
  grep -E '^(dvc|dvclive|ctranslate2)\b' requirements.txt | "$PYTHON" -m pip download -q --only-binary=:all: \
    --python-version "$PY_VERSION" --implementation cp "${platforms[@]}" --find-links "$dir/wheels" \
    -d "$dir/wheels" -r /dev/stdin
  echo "bundle: $(ls "$dir/wheels" | wc -l) wheels ($(du -sh "$dir/wheels" | cut -f1)) and multi30k in $dir"
  exit 0
fi

PEAK_TFLOPS=${PEAK_TFLOPS:-989}
MULTI30K=${MULTI30K:-${BUNDLE:+$BUNDLE/multi30k}}
MULTI30K=${MULTI30K:-../shared/data/multi30k}
MINUTES=${MINUTES:-1}
MAX_TOKENS=${MAX_TOKENS:-32768}
D_MODEL=${D_MODEL:-512}
LAYERS=${LAYERS:-3}
DEVICE=${DEVICE:-cuda}
COMPILE=${COMPILE:-0}
rm -rf "$WORK" && mkdir -p "$WORK"

missing=$(missing_requirements)
if [ -n "$missing" ]; then
  echo "installing into $WORK/site: $(echo $missing)"
  wheels=${BUNDLE:+$BUNDLE/wheels}
  if [ -z "$wheels" ]; then  # from the index: these requirements and all they need, as wheels
    wheels=$WORK/wheels
    echo "$missing" | "$PYTHON" -m pip wheel -q -w "$wheels" -r /dev/stdin
  fi
  # Only the distributions the running python lacks, so that its own (torch's above all) stay in force.
  "$PYTHON" - "$wheels" >"$WORK/to_install" <<'PY'
import importlib.metadata, re, sys
from pathlib import Path
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731
have = {norm(d.metadata["Name"]) for d in importlib.metadata.distributions()}
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    if norm(wheel.name.split("-")[0]) not in have:
        print(wheel)
PY
  xargs -r -a "$WORK/to_install" "$PYTHON" -m pip install -q --no-deps --no-index --no-compile --target "$WORK/site"
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  still=$(missing_requirements)
  [ -z "$still" ] || { echo "gpu_check: still missing after the install: $still" >&2; exit 1; }
fi
torch_info=$("$PYTHON" -c "import torch; print(torch.__version__,
                           torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')")
echo "torch $torch_info"

tests=passed
"$PYTHON" -m pytest -q -m cuda tests/ || tests=failed

write_params() {  # $1: 1 to compile the model
  "$PYTHON" - "$WORK/params.yaml" "$MULTI30K" "$PEAK_TFLOPS" "$DEVICE" "$MINUTES" "$MAX_TOKENS" "$D_MODEL" "$1" <<'PY'
import sys, yaml
from lib.core.text import load_params  # as the stages read it
out, source, peak, device, minutes, max_tokens, d_model, compile_ = sys.argv[1:]
params = load_params("params.yaml")
params["tasks"] = ["multi30k"]
m = params["multi30k"]
m["fetch"]["source"] = source
m["train"].update(device=device, precision="bf16" if device == "cuda" else "fp32", epochs=1000, time_budget_minutes=float(minutes), patience=0,
                  max_tokens=int(max_tokens), peak_tflops=float(peak), checkpoint_every=100_000,
                  compile=compile_ == "1")
m["train"]["model"].update(d_model=int(d_model), n_heads=8, d_ff=4 * int(d_model))
yaml.safe_dump(params, open(out, "w"))
PY
}
write_params "$COMPILE"
"$PYTHON" -m stages.fetch multi30k --out "$WORK/sources" --params "$WORK/params.yaml"
"$PYTHON" -m stages.prepare multi30k --source "$WORK/sources" --out "$WORK/data" --params "$WORK/params.yaml"
"$PYTHON" -m stages.tokenize multi30k --data "$WORK/data" --out "$WORK/tokenizer" --params "$WORK/params.yaml"

# The eager step alone at a quarter of, at and at twice the train stage's batch: how MFU moves with
# the batch (launch-bound when it rises with it, bound by the kernels themselves when it does not),
# and a profile of each: which kernels the time goes to, and the products' own rate.
steps=10 rounds=2 profile=3 precision=bf16 square=0
[ "$DEVICE" = cpu ] && steps=2 rounds=1 profile=1 precision=fp32 square=256
throughput() {
  PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" benchmarks/throughput/train_throughput.py --device "$DEVICE" \
    --precision $precision --square $square --d-model "$D_MODEL" --d-ff $((4 * D_MODEL)) --heads 8 --layers "$LAYERS" --dropout 0.2 \
    --activation-dropout 0 --steps $steps --rounds $rounds --profile $profile --data "$WORK/data" \
    --tokenizer "$WORK/tokenizer" "$@"
}
throughput --max-tokens $((MAX_TOKENS / 4)) "$MAX_TOKENS" $((MAX_TOKENS * 2)) | tee "$WORK/throughput.jsonl"
# Ours compiled (train.compile's torch.compile: the element-wise work around the products fused) at the
# train stage's batch, and its profile: what fusing buys. Compiling takes a minute or two; should it
# fail, the summary says why and the training still runs.
if throughput --max-tokens "$MAX_TOKENS" --models ours --compile >"$WORK/compiled.jsonl" 2>"$WORK/compiled.log"; then
  cat "$WORK/compiled.jsonl"
else
  tail -c 2000 "$WORK/compiled.log"
  echo "gpu_check: the compiled step failed (above); going on" >&2
fi

# The paper's base recipe (params.yaml's wmt14: d_model 512, 6 + 6 layers, d_ff 2048, dropout 0.1, a
# 37,000-token vocabulary), ours alone, on random ids of WMT14-like lengths batched as wmt14's are (about
# 25,000 real tokens a side a step): its rate, MFU and peak memory, and the hours its 100,000 steps would
# take. A CPU's run is a smoke test: a small batch and vocabulary.
base_tokens=25000 base_vocab=37000 base_width=512 base_layers=6
[ "$DEVICE" = cpu ] && base_tokens=256 base_vocab=1000 base_width=64 base_layers=1
PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" benchmarks/throughput/train_throughput.py --device "$DEVICE" \
  --precision $precision --square $square --d-model $base_width --d-ff $((4 * base_width)) --heads 8 \
  --layers $base_layers --dropout 0.1 --activation-dropout 0 \
  --steps $steps --rounds $rounds --models ours --max-tokens $base_tokens --synthetic-vocab $base_vocab \
  | tee "$WORK/base.jsonl"

# The progress bar goes to train.log with the rest; the log's own lines are shown.
train() {
  "$PYTHON" -m stages.train multi30k --data "$WORK/data" --tokenizer "$WORK/tokenizer" --model "$WORK/model.pt" \
    --checkpoints "$WORK/ckpt" --live "$WORK/live" --params "$WORK/params.yaml" 2>"$WORK/train.log"
}
compiled=$COMPILE
if ! train; then
  tail -c 4000 "$WORK/train.log"
  [ "$COMPILE" = 1 ] || exit 1
  echo "gpu_check: compiled training failed (above); training eager instead" >&2
  mv "$WORK/train.log" "$WORK/train-compiled.log"
  compiled=failed
  write_params 0
  train || { tail -c 4000 "$WORK/train.log"; exit 1; }
fi
grep -a -o -E '(INFO|WARNING) .*' "$WORK/train.log" | cut -c1-200

# torch's version as printed above: this python spares torch's 3 s import.
"$PYTHON" - "$WORK" "$tests" "$PEAK_TFLOPS" "$MAX_TOKENS" "$compiled" "${torch_info%% *}" <<'PY' \
  | tee "$WORK/summary.json"
import json, sys
from pathlib import Path
import pandas as pd
work, tests, peak, max_tokens = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
compiled = {"1": True, "0": False}.get(sys.argv[5], sys.argv[5])  # or "failed" (then trained eager)
read = lambda name: pd.read_csv(work / f"live/plots/metrics/{name}.tsv", sep="\t").iloc[:, -1]  # noqa: E731
tokens, mfu, valid = read("train/tokens_per_s"), read("train/mfu"), read("valid/loss")
skip = min(20, len(tokens) // 5)  # warm-up steps
benches = [json.loads(line) for line in (work / "throughput.jsonl").read_text().splitlines()]
compiled_step = [json.loads(line) for line in (work / "compiled.jsonl").read_text().splitlines()]
base = json.loads((work / "base.jsonl").read_text().splitlines()[-1])
SHOWN = ("step_ms", "busy_ms", "matmul_tflops", "kinds_share", "error")  # of each profile: the rest is in the .jsonl


def shown(b: dict) -> dict:  # one line of train_throughput.py's, in short
    return {"max_tokens": b["max_tokens"], "tokens_per_step": b["tokens_per_step"], "tokens_per_s": b["tokens_per_s"],
            **{k: b[k] for k in ("ratio_ours_over_torch",) if k in b},
            "matmul_peak_tflops": max(b["matmul_peak_gflops"]) / 1000, "mfu_vs_measured_peak": b["mfu"],
            "profile": {name: {k: v for k, v in p.items() if k in SHOWN} for name, p in b["profile"].items()}}


failed = [line for line in (work / "compiled.log").read_text().splitlines() if line.strip()][-1:]
print(json.dumps({
    "benchmark": "gpu_check", "device": benches[0]["device"], "torch": sys.argv[6], "cuda_tests": tests,
    "peak_tflops": peak,
    "train": {"max_tokens": max_tokens, "compile": compiled,
              "tokens_per_s_median": round(tokens[skip:].median()),
              "mfu_median": round(mfu[skip:].median(), 3), "best_valid_loss": round(valid.min(), 4),
              "epochs": len(valid), "steps": len(tokens)},
    "throughput": [shown(b) for b in sorted(benches, key=lambda b: b["max_tokens"])],
    "compiled_step": shown(compiled_step[0]) if compiled_step else {"error": (failed or ["no output"])[0][:300]},
    # The paper's 100,000 steps of the batch measured (about 25,000 source and 25,000 target tokens)
    "base_recipe": {"tokens_per_step": base["tokens_per_step"], "tokens_per_s": base["tokens_per_s"]["ours"],
                    "mfu_vs_measured_peak": base["mfu"]["ours"], "peak_memory_gb": base["peak_memory_gb"],
                    "hours_to_100k_steps": round(100_000 * base["tokens_per_step"] / base["tokens_per_s"]["ours"]
                                                 / 3600, 1)},
}))
PY
[ "$tests" = passed ]

#!/usr/bin/env bash
# One GPU, under 5 minutes: the CUDA-marked tests, then multi30k trained for 3 minutes in bf16 at
# d_model 512, printing tokens/s, model FLOPs utilisation and the validation loss reached.
#   bash benchmarks/gpu_check.sh                 # from the repository root
#   PEAK_TFLOPS=989 MULTI30K=../shared/data/multi30k bash benchmarks/gpu_check.sh
# PEAK_TFLOPS: the GPU's dense bf16 peak (H100/H200 SXM: 989). Uses the machine's CUDA build of torch
# when it has one (requirements.txt pins the CPU wheel), installing the other requirements beside it.
set -euo pipefail
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
MULTI30K=${MULTI30K:-../shared/data/multi30k}
OUT=${OUT:-/tmp/gpu_check}
VENV=${VENV:-.venv-gpu}

python3 -m venv --system-site-packages "$VENV"
. "$VENV/bin/activate"
if ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126
fi
grep -v '^torch' requirements.txt | pip install -q -r /dev/stdin
python -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

python -m pytest -q -m cuda tests/

rm -rf "$OUT" && mkdir -p "$OUT"
python - "$OUT/params.yaml" "$MULTI30K" "$PEAK_TFLOPS" <<'PY'
import sys, yaml
out, source, peak = sys.argv[1], sys.argv[2], float(sys.argv[3])
params = yaml.safe_load(open("params.yaml"))
params["tasks"] = ["multi30k"]
m = params["multi30k"]
m["prepare"]["source"] = source
m["train"].update(device="cuda", precision="bf16", epochs=100, time_budget_minutes=3.0, patience=0,
                  max_tokens=8192, peak_tflops=peak, checkpoint_every=1000)
m["train"]["model"].update(d_model=512, n_heads=8, d_ff=2048)
yaml.safe_dump(params, open(out, "w"))
PY
python -m stages.prepare multi30k --out "$OUT/data" --params "$OUT/params.yaml"
python -m stages.tokenize multi30k --data "$OUT/data" --out "$OUT/tokenizer" --params "$OUT/params.yaml"
python -m stages.train multi30k --data "$OUT/data" --tokenizer "$OUT/tokenizer" --model "$OUT/model.pt" \
  --checkpoints "$OUT/ckpt" --live "$OUT/live" --params "$OUT/params.yaml"
python - "$OUT/live" <<'PY'
import json, sys
import pandas as pd
live = sys.argv[1]
read = lambda name: pd.read_csv(f"{live}/plots/metrics/{name}.tsv", sep="\t").iloc[:, -1]
tokens, mfu, valid = read("train/tokens_per_s"), read("train/mfu"), read("valid/loss")
skip = min(20, len(tokens) // 5)  # warm-up steps
print(json.dumps({"benchmark": "gpu_check", "tokens_per_s_median": round(tokens[skip:].median()),
                  "mfu_median": round(mfu[skip:].median(), 3), "best_valid_loss": round(valid.min(), 4),
                  "epochs": len(valid)}))
PY

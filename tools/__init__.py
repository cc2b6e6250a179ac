"""What the tests and studies run: the deps of dvc.yaml (deps.py), the mutation runner and its mutations, the GPU
check (gpu_check.sh, which runs benchmarks/throughput), a load test of the served app, and the line every result
starts with."""

"""What the tests and studies run: the mutation runner, the GPU check and what it measures with, a load test."""

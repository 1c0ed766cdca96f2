"""Side-by-side benchmarks; ``make bench`` (``python -m benchmarks``) runs every ``bench_*.py``."""

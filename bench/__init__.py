"""Benchmarks: `make bench` (all) and `make bench-quick`. They report numbers; they never fail on them."""

"""Benchmarks: `make bench` (all) and `make bench-quick`. They report numbers, never pass/fail."""

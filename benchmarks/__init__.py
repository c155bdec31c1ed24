"""Benchmarks: server time per round, simulation throughput."""

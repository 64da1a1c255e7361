"""Benchmarks: each module is run as ``python -m tools.bench.NAME`` from the
repository root and prints the table ``docs/benchmarks.md`` shows under its
command. Tests never import these modules; what a test needs lives in
``tools.fixtures``.
"""

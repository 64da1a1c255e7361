"""Analyses of a Graph: training regions, tensor sizes and the memory estimate."""

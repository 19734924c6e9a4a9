"""Experiments of many runs: sweeps, the fault matrix, the chaos soak."""

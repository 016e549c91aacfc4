"""Measuring a running SGLang server: load sweeps, threshold calibration, live equivalence."""

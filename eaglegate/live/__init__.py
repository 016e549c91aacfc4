"""Measuring a running SGLang server: load sweeps, threshold calibration, live equivalence."""

# One thread per request in flight (and one for its deadline): a machine runs out of
# threads long before a level this high is worth measuring. Here, not in `sweep`, so the
# command line can say it without loading the HTTP client.
MAX_CONCURRENCY = 8192

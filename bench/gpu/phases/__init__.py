"""What a call does with its servers once they are up, one module a phase: throughput (the
rows, one server at a time or side by side, and calibrate's threshold), equivalence (greedy
outputs against each other), catch-up (acceptance after the gate resumes) and profile
(SGLang's torch profiler under load)."""

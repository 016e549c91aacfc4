"""eaglegate: map SGLang's scheduler → EAGLE worker paths and gate speculation by batch size."""

__version__ = "0.1.0"

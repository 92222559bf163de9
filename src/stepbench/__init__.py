"""stepbench: how should this model's training step run on this GPU, how fast, does it fit, and
what does a token cost."""

__version__ = "0.1.0"

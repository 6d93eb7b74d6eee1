"""bless: bless, verify and serve compiled torch.compile / CUDA-graph caches, fail closed."""

__version__ = "0.1.0"

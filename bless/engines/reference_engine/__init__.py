"""The bless reference engine: a tiny byte-level transformer served over an OpenAI-compatible HTTP subset.

It exists so the whole bless product (bootstrap, replay-coherence trials, cache-reuse classification,
serve-full) can run for real on any machine: it compiles with ``torch.compile`` (Inductor C++ on CPU,
CUDA graphs on GPU), persists the compiled artifact with PyTorch's Mega-Cache in the mounted cache
directory and prints vLLM-like load/save markers (see ``markers.py`` and ``README.md``).

The package runs in two places: inside a container image, copied there as the top-level package
``bless_reference`` (``python3 -m bless_reference ...``), and on a GPU host from where it lies, loaded under
the same name by ``python3 .../reference_engine/launch.py ...`` (``python3 -m bless.engines.reference_engine``
would import the bless package, and its dependencies, first). So it uses only the standard library and torch,
and only relative imports. Importing this package (or ``markers`` / ``knobs``) does not import torch.
"""

# Bumped whenever a change alters the compiled graph or the artifact format: it is part of the
# artifact key, so an old artifact is never loaded by a new engine.
ENGINE_VERSION = "1"

__all__ = ["ENGINE_VERSION"]

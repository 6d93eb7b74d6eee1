"""bless's version, in a module of its own: the core imports it without importing the public API."""

__version__ = "0.1.0"

#: The distribution's name on a package index (``pip install bless-cache``); the import name stays ``bless``.
DISTRIBUTION = "bless-cache"

"""The bless command line: thin typer apps that parse, call ``bless``, and render.

Humans read stderr (rich tables, progress bars, diagnostics); machines read stdout, where
``--json`` writes exactly one JSON document. Nothing here decides policy: that is ``bless``.
"""

# The repository keeps this package in cli/; it is installed (and, in a checkout, reached through the bless/cli
# symlink) as bless.cli. Imported as a top-level ``cli`` (the checkout on PYTHONPATH and ``-m`` with the old name) it
# would be a second copy of every module, with its own state, so that name is refused.
if __name__ != "bless.cli":
    raise ImportError(f"bless's command line is the package bless.cli, not {__name__}: use python3 -m bless.cli.main")

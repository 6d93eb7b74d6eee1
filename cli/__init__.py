"""The bless command line: thin typer apps that parse, call ``bless``, and render.

Humans read stderr (rich tables, progress bars, diagnostics); machines read stdout, where
``--json`` writes exactly one JSON document. Nothing here decides policy: that is ``bless``.
"""

"""How names from disk and manifests are shown: :mod:`bless.untrusted_text`, under the name the core and the
layers above it import it by. It lives in the vocabulary at the bottom of the layering, so that ``errors.py``
and ``system/`` use the one rule without importing the core."""

from __future__ import annotations

from bless.untrusted_text import (
    has_credentials,
    is_unicode,
    json_safe,
    shown,
    unicode_safe,
    without_credentials,
    xml_safe,
)

__all__ = ["has_credentials", "is_unicode", "json_safe", "shown", "unicode_safe", "without_credentials", "xml_safe"]

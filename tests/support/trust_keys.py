"""The key sources the tests sign with: file keys encrypted with a fixed passphrase (what ``trust init`` writes)."""

from __future__ import annotations

from bless.trust import KeySources
from bless.trust.keys import PASSPHRASE_ENV

#: The passphrase of the tests' file keys (the CLI tests give it through BLESS_KEY_PASSPHRASE).
TEST_PASSPHRASE = "bless test passphrase"
TEST_KEYS = KeySources(passphrase=TEST_PASSPHRASE.encode())
#: The environment of a ``bless`` process that writes or opens those keys.
KEY_ENV = {PASSPHRASE_ENV: TEST_PASSPHRASE}

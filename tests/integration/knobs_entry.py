"""``bless`` with the reference engine's test knobs allowed: how bless's own integration tests run them.

The knobs (``BLESS_REFERENCE_NONDETERMINISTIC`` and the others) make a start unfit to bless, so
every ``bless`` and ``serve-full`` command refuses them (exit 30), whatever the environment holds.
Only a Python caller can allow them, through a parameter of the entry point; this file is that
caller. It lives with the tests and is not installed: running it is running bless's test suite
code, not a production command. Usage: ``python tests/integration/knobs_entry.py [bless args]``
with the repository on ``PYTHONPATH`` (``helpers.run_cli(..., allow_test_knobs=True)`` does this).
"""

from __future__ import annotations

from bless.cli.main import main

if __name__ == "__main__":
    main(allow_test_knobs=True)

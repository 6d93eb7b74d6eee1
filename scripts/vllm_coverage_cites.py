#!/usr/bin/env python3
"""Write the verbatim source lines ``bless/engines/vllm/coverage_rules.py`` cites, for the unit tests.

For one release, every :class:`~bless.engines.vllm.coverage_rules.Cite` of its rules becomes a block of
``tests/fixtures/vllm/coverage/<release>/cited.txt``: a header naming the file and line range, then the cited line
with one line of context either side, verbatim from the release's wheel (unpacked, or the wheel file itself). The
test then checks each citation's text is on its line. A citation whose line does not exist fails here.

Usage (from the repository root; no network)::

    python3 scripts/vllm_coverage_cites.py 0.33.0 /tmp/src033          # the directory holding vllm/
    python3 scripts/vllm_coverage_cites.py 0.33.0 vllm-0.33.0-...whl
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bless.engines.vllm.coverage_rules import RELEASE_RULES  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "vllm" / "coverage"
CONTEXT = 1


class SourceFiles:
    """The release's files, from an unpacked tree (the directory holding ``vllm/``) or the wheel itself."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.wheel = zipfile.ZipFile(source) if source.is_file() else None
        self.cache: dict[str, list[str]] = {}

    def lines(self, path: str) -> list[str]:
        if path not in self.cache:
            raw = self.wheel.read(path) if self.wheel else (self.source / path).read_bytes()
            self.cache[path] = raw.decode("utf-8").splitlines()
        return self.cache[path]


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in RELEASE_RULES:
        print(f"usage: vllm_coverage_cites.py {{{','.join(RELEASE_RULES)}}} SOURCE", file=sys.stderr)
        return 2
    release, source = argv[0], Path(argv[1])
    files = SourceFiles(source)
    blocks: list[str] = []
    for cite in sorted(set(RELEASE_RULES[release].cites()), key=lambda c: (c.path, c.line)):
        lines = files.lines(cite.path)
        if not 1 <= cite.line <= len(lines) or cite.text not in lines[cite.line - 1]:
            print(f"{cite}: {cite.text!r} is not on that line of vllm {release}", file=sys.stderr)
            return 1
        first, last = max(1, cite.line - CONTEXT), min(len(lines), cite.line + CONTEXT)
        blocks.append(f"# vllm {release} {cite.path}, lines {first}-{last} verbatim")
        blocks.extend(lines[first - 1 : last])
    out = FIXTURES / release / "cited.txt"
    out.write_text("\n".join(blocks) + "\n", encoding="utf-8")
    print(f"{release}: {len(blocks)} lines of cited source in {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

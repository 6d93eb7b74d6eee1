"""Every command block of the README and of every page under docs/ parses against this checkout; the offline ones
run for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.readme_blocks import PAGES, REPO, Block, all_blocks, check_parses, readme_blocks, run_block

BLOCKS = all_blocks()


def test_the_readme_has_blocks_of_each_kind() -> None:
    assert {block.marker for block in BLOCKS} == {None, "offline", "docker"}


def test_every_page_under_docs_is_read() -> None:
    """The discovery takes docs/**/*.md: the guides' and concepts' blocks are among those checked."""
    pages = {path.relative_to(REPO).as_posix() for path in PAGES}
    assert "README.md" in pages
    assert {"docs/getting-started.md", "docs/guides/fleet.md", "docs/guides/ci-gate.md", "docs/guides/vllm.md"} <= pages
    assert {path.relative_to(REPO).as_posix() for path in (REPO / "docs").rglob("*.md")} <= pages
    with_blocks = {block.page for block in BLOCKS}
    assert {"README.md", "docs/getting-started.md", "docs/guides/serving.md", "docs/guides/fleet.md"} <= with_blocks


def test_a_continued_line_is_one_command() -> None:
    block = Block(1, None, "# comment\nA=1 bash scripts/main.sh \\\n  --x\nbless list")
    assert block.commands() == ["A=1 bash scripts/main.sh   --x", "bless list"]


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_every_command_parses(block: Block) -> None:
    before = _checkout_files()
    for line in block.commands():
        check_parses(line)
    assert _checkout_files() == before, "checking a command must not run it"


def _checkout_files() -> set[str]:
    """Top-level names in the checkout (a command that ran would leave e.g. a ``~`` dir from ``--keys ~/x``)."""
    return {path.name for path in REPO.iterdir()}


@pytest.mark.parametrize(
    "block",
    [block for block in BLOCKS if block.marker == "offline"],
    ids=[block.id for block in BLOCKS if block.marker == "offline"],
)
def test_offline_blocks_run(block: Block, tmp_path: Path) -> None:
    result = run_block(block, tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "the block printed nothing"


def test_parse_check_catches_what_a_user_would_hit(tmp_path: Path) -> None:
    """The check is not a rubber stamp: unknown options, missing files, missing scripts all fail it."""
    with pytest.raises(Exception, match="No such option"):
        check_parses("bless gate profiles/reference-cpu.toml --manifest-dir manifests/blessed")
    with pytest.raises(Exception, match="No such command"):
        check_parses("bless serve --profile profiles/reference-cpu.toml")
    with pytest.raises(AssertionError, match="matches nothing"):
        check_parses("bless gate profiles/*.yaml")
    with pytest.raises(AssertionError, match=r"no scripts/nope\.sh"):
        check_parses("bash scripts/nope.sh")
    check_parses("BLESS_SKIP_DOCKER=1 .venv/bin/bless --root /tmp/x run --profile profiles/reference-cpu.toml --wait")
    check_parses('REG="$(cat ~/bless-fleet/registry/registry.addr)"')  # a variable for the lines after it
    with pytest.raises(AssertionError, match="no command"):
        check_parses("# only a comment")
    assert json.loads(run_block(Block(1, "offline", "bless exit-codes --json"), tmp_path, timeout=120).stdout)["ok"]


def test_the_venv_is_activated_right_after_the_two_commands() -> None:
    """The README's later lines call bless by name: the block after main.sh / test.sh must put it on PATH."""
    first, second = readme_blocks()[0], readme_blocks()[1]
    assert "bash scripts/main.sh" in first.text
    assert second.commands()[0].split("#")[0].split() == ["source", ".venv/bin/activate"]
    assert any(line.startswith("bless ") for line in second.commands())
    with pytest.raises(AssertionError, match="activates"):
        check_parses("source ~/other-venv/bin/activate")


def test_clean_up_undoes_what_setup_and_the_examples_start() -> None:
    """The Clean up block names a way to stop or remove each thing: registry, dockerd, image, build cache, store."""
    page = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    section = page.split("\n## Clean up\n", 1)[1].split("\n## ", 1)[0]
    (block,) = [block for block in BLOCKS if block.page == "docs/getting-started.md" and block.text in section]
    commands = block.commands()
    for expected in (
        "serve-full stop ",
        "bash scripts/start-registry.sh --stop ",
        "bash scripts/ensure-docker.sh --stop",
        "docker image rm bless-reference:0.1.0",
        'rm -rf "$(bash scripts/images/build-reference-image.sh --cache-dir)"',
        "rm -rf ~/.cache/bless ",
    ):
        assert any(line.startswith(expected) for line in commands), expected

"""The front page stays a front page: its first lines are the two set-up commands (.ci/run runs
the second one verbatim), it stays within 150 lines, and every relative link in it and in docs/
points at a file that exists (the detail lives in docs/)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _commands() -> list[str]:
    lines = README.read_text().splitlines()
    assert lines[0] == "# specbench" and lines[2] == "```bash", "the README opens with its set-up block"
    block = lines[3:lines.index("```", 3)]
    return [line for line in block if not line.startswith("#")]


def test_the_readme_opens_with_the_main_job_then_the_tests():
    run, tests = _commands()
    assert run.endswith("&& .venv/bin/specbench run"), run
    assert tests.endswith("&& .venv/bin/python -m pytest"), tests
    assert run.rsplit("&&", 1)[0] == tests.rsplit("&&", 1)[0], "both set up the same way"


def test_ci_runs_the_readmes_test_command_verbatim():
    _, tests = _commands()
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines(), ".ci/run must run the README's test command"


def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= 150, f"README.md has {n} lines: move the detail to docs/"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_relative_links_resolve():
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = page.parent / path if path else page
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken

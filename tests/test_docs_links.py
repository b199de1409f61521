"""The README and the guides point at things that exist, and the command reference is the code's.

Every relative link or image in README.md, docs/ and notebooks/README.md names a file of the
repository (and, for a heading anchor, a heading of that page); docs/cli.md is what
docs/scripts/cli_reference.py renders from the commands' declared flags.
"""

import pathlib
import re
import runpy

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PAGES = [ROOT / "README.md", ROOT / "notebooks" / "README.md",
         *sorted((ROOT / "docs").rglob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no headings in code
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def _links(page: pathlib.Path):
    # code blocks dropped, their lines kept (so the line numbers are the page's)
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), page.read_text(),
                  flags=re.S)
    for match in LINK.finditer(text):
        target = match.group(1)
        if not re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not checked here
            yield text[:match.start()].count("\n") + 1, target


def test_every_relative_link_resolves():
    broken = []
    count = 0
    for page in PAGES:
        for line, target in _links(page):
            count += 1
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{line}: {target}"
            if not file.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                broken.append(f"{where} (no such heading)")
    assert count > 20  # the pattern finds the links (a broken one would find none)
    assert not broken, broken


def test_the_readme_is_a_landing_page():
    """Short, with the quickstart's figure; measured details live in the guides."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    assert "![" in text and (ROOT / "docs" / "quickstart.png").exists()


def test_the_command_reference_is_generated_from_the_code():
    script = runpy.run_path(str(ROOT / "docs" / "scripts" / "cli_reference.py"))
    assert script["render"]() == (ROOT / "docs" / "cli.md").read_text(), (
        "docs/cli.md differs from the CLI's declarations: run python docs/scripts/cli_reference.py")

"""The design document exists, and every pointer into it from code, tests and the README names one of its sections."""

import re
from pathlib import Path


ROOT = Path(__file__).parent.parent
DESIGN = ROOT / "docs" / "design.md"
POINTER = re.compile(r"docs/design\.md#([a-z0-9-]+)")


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def _project_texts():
    for folder in ("trl_ext", "tests", "recipes", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, path.read_text()
    yield ROOT / "README.md", (ROOT / "README.md").read_text()
    yield DESIGN, DESIGN.read_text()


def test_every_pointer_names_a_section_of_the_design_document():
    anchors = _anchors(DESIGN.read_text())
    assert {"the-seams", "the-pure-core", "adding-a-task-family", "adding-an-environment"} <= anchors
    pointers = {(path.name, anchor) for path, text in _project_texts() for anchor in POINTER.findall(text)}
    assert len(pointers) >= 5  # the trainers and core modules point to their sections
    assert [(name, anchor) for name, anchor in pointers if anchor not in anchors] == []


def test_the_contents_list_every_section():
    text = DESIGN.read_text()
    sections = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    listed = re.findall(r"^\d+\. \[(.+?)\]\(#([a-z0-9-]+)\)$", text, flags=re.MULTILINE)
    assert [title for title, _ in listed] == sections
    assert {anchor for _, anchor in listed} <= _anchors(text)


def test_the_readme_sends_readers_to_the_design_document():
    assert "docs/design.md" in (ROOT / "README.md").read_text()

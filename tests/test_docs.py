"""The documentation holds together: the design document's sections and the pointers into it, the links between the
README and the docs/ pages, the README's length, the commands it shows and its layout map."""

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest


ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DESIGN = DOCS / "design.md"
POINTER = re.compile(r"docs/design\.md#([a-z0-9_-]+)")
MAX_README_LINES = 300
FENCE = re.compile(r"^```.*?^```[ \t]*$", flags=re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", flags=re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but `-` and `_` dropped, spaces as hyphens, `-1`, `-2`, ...
    after a repeated heading. Headings inside fenced code blocks do not count."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+?)#*$", FENCE.sub("", markdown), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _links(markdown: str) -> list[str]:
    """Targets of inline links and images, outside code blocks and code spans."""
    prose = CODE_SPAN.sub(lambda m: "code", FENCE.sub("", markdown))
    return LINK.findall(prose)


def _fenced_blocks(markdown: str) -> list[tuple[str, str]]:
    """(info string, body) of each fenced code block."""
    blocks, info, body = [], None, []
    for line in markdown.splitlines():
        if info is None and line.startswith("```"):
            info, body = line[3:].strip(), []
        elif info is not None and line.rstrip() == "```":
            blocks.append((info, "\n".join(body)))
            info = None
        elif info is not None:
            body.append(line)
    return blocks


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def _project_texts():
    for folder in ("trl_ext", "tests", "recipes", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, path.read_text()
    yield README, README.read_text()
    yield DESIGN, DESIGN.read_text()


# The design document.


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
    assert "docs/design.md" in README.read_text()


# Links between the README and the docs pages.


def test_every_relative_link_points_to_an_existing_file_and_section():
    broken = []
    for page in [README, ROOT / "recipes" / "README.md", *_pages()]:
        for target in _links(page.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http(s):, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such section)")
    assert broken == []


def test_the_readme_links_every_docs_page():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in _links(README.read_text())}
    assert [page.name for page in _pages() if page.resolve() not in linked] == []


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


# The README's commands.

GPU_ONLY = ("CUDA_VISIBLE_DEVICES", "vllm serve")
PLACEHOLDER = re.compile(r"<[^>]*>|\borg/name\b|\bDIR\b")
SCRIPT = re.compile(r"^(recipes|benchmarks)/[^/]+\.py$")


def _readme_commands() -> list[list[str]]:
    """The runnable commands of the README's ```bash blocks, one token list per `&&`-separated command; commands for
    GPUs and lines with placeholders are left out."""
    commands = []
    for block in [body for info, body in _fenced_blocks(README.read_text()) if info == "bash"]:
        for line in block.replace("\\\n", " ").splitlines():
            if not line.strip() or any(marker in line for marker in GPU_ONLY) or PLACEHOLDER.search(line):
                continue
            for command in line.split("&&"):
                tokens = shlex.split(command, comments=True)
                if tokens and (tokens[0].startswith("python") or tokens[0] in ("accelerate", "torchrun")):
                    commands.append(tokens)
    return commands


def _script_and_flags(tokens: list[str]) -> tuple[str | None, list[str]]:
    """The recipes/ or benchmarks/ script a command runs, and the flags passed to it (up to a bare `--`)."""
    for i, token in enumerate(tokens):
        if SCRIPT.match(token):
            rest = tokens[i + 1 :]
            rest = rest[: rest.index("--")] if "--" in rest else rest
            return token, [t.split("=", 1)[0] for t in rest if t.startswith("--")]
    return None, []


def _help(script: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run(
        [sys.executable, script, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{script} --help failed:\n{done.stderr[-2000:]}"
    return done.stdout


def test_the_readme_commands_name_existing_scripts_modules_files_and_markers():
    commands = _readme_commands()
    scripts = {_script_and_flags(tokens)[0] for tokens in commands} - {None}
    assert {"recipes/rlcr.py", "recipes/replay_grpo.py", "recipes/absolute_zero.py"} <= scripts
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = re.search(r"^markers = \[(.*?)^\]", pyproject, flags=re.MULTILINE | re.DOTALL)
    markers = set(re.findall(r"\"(\w+):", declared.group(1)))
    problems = []
    for tokens in commands:
        if tokens[0].startswith("python") and tokens[1:2] == ["-m"]:
            module = tokens[2]
            if importlib.util.find_spec(module) is None:
                problems.append(f"no module {module}: {shlex.join(tokens)}")
            if module == "pytest" and "-m" in tokens[3:]:
                expression = tokens[3:][tokens[3:].index("-m") + 1]
                problems += [
                    f"unknown marker {name}"
                    for name in re.findall(r"\w+", expression)
                    if name not in {"and", "or", "not"} | markers
                ]
        for token in tokens[1:]:  # files the command names: scripts, configs
            if not token.startswith("-") and "/" in token and re.search(r"\.(py|ya?ml|json|jsonl)$", token):
                if not (ROOT / token).is_file():
                    problems.append(f"no file {token}: {shlex.join(tokens)}")
    assert problems == []


@pytest.mark.slow  # 18-29 s measured on 2 busy cores: each recipe imports TRL to print its help
def test_the_readme_commands_pass_only_flags_their_scripts_accept():
    """`<script> --help` once per script (the recipes parse every TRL and trainer option), in parallel."""
    wanted: dict[str, set[str]] = {}
    for tokens in _readme_commands():
        script, flags = _script_and_flags(tokens)
        if script is not None:
            wanted.setdefault(script, set()).update(flags)
    with ThreadPoolExecutor(max_workers=max(1, min(len(wanted), os.cpu_count() or 1))) as pool:
        helps = dict(zip(wanted, pool.map(_help, wanted)))
    unknown = [
        f"{script} {flag}"
        for script, flags in wanted.items()
        for flag in sorted(flags)
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[script])
    ]
    assert unknown == []


# The layout map.


def test_the_layout_map_lists_every_package_folder_and_only_real_paths():
    blocks = [body for _, body in _fenced_blocks(README.read_text()) if re.search(r"^trl_ext/\w+/", body, flags=re.M)]
    assert len(blocks) == 1, "the README has one fenced layout map listing trl_ext/<folder>/ lines"
    entries = [line.split()[0] for line in blocks[0].splitlines() if line.strip() and not line[0].isspace()]
    listed = {m.group(1) for e in entries if (m := re.fullmatch(r"trl_ext/(\w+)/", e))}
    packages = {p.name for p in (ROOT / "trl_ext").iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert {"missing from the map": sorted(packages - listed), "not a package": sorted(listed - packages)} == {
        "missing from the map": [],
        "not a package": [],
    }
    assert [e for e in entries if not (ROOT / e).exists()] == []


# The design document's seam table.

TABLE_TRAINERS = {
    "RLCR": "RLCRMultiTurnTrainer",
    "Replay": "ReplayGRPOTrainer",
    "Absolute Zero": "AbsoluteZeroTrainer",
}
NOT_A_SEAM = {"__init__", "_tag_names", "_name", "_paper"}  # every trainer's constructor; the model card's metadata


def _seam_table() -> dict[str, dict[str, str]]:
    """`{method: {column: cell}}` of the design document's seam table (a row naming several methods gives each)."""
    section = DESIGN.read_text().split("## The seams", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        for method in re.findall(r"`(\w+)`", cells["seam"]):
            rows[method] = cells
    return rows


def test_the_seam_table_matches_each_trainers_mro():
    """Per trainer, both ways: every `GRPOTrainer` method a class of its MRO overrides has a row whose cell is not `—`
    and names the mixins that override it; a `—` cell is a method no class of it overrides; every mixin of the MRO is
    named in its column, and every class its column names exists (in the MRO when it overrides a seam)."""
    from trl import GRPOTrainer

    import trl_ext.trainers

    table = _seam_table()
    trainers = {column: getattr(trl_ext.trainers, name) for column, name in TABLE_TRAINERS.items()}
    mixins = {k.__name__ for cls in trainers.values() for k in cls.__mro__[1 : cls.__mro__.index(GRPOTrainer)]}
    modules = [m for name, m in sys.modules.items() if name.startswith("trl_ext.")]
    problems = []
    for column, cls in trainers.items():
        own = cls.__mro__[: cls.__mro__.index(GRPOTrainer)]
        overriders: dict[str, set[str]] = {}
        for k in own:
            for name in vars(k):
                if hasattr(GRPOTrainer, name) and not name.startswith("__") and name not in NOT_A_SEAM:
                    overriders.setdefault(name, set()).add(k.__name__)
        for method, by in sorted(overriders.items()):
            cell = table.get(method, {}).get(column, "—")
            named = set(re.findall(r"`([A-Z]\w+)`", cell)) & mixins
            if cell.startswith("—"):
                problems.append(f"{column}: {method} is overridden by {sorted(by)}; the table says TRL's")
            elif named != by - {cls.__name__, "TrlExtGRPOTrainer"}:
                problems.append(f"{column}: {method} is overridden by {sorted(by)}; the table names {sorted(named)}")
        for method, cells in table.items():
            if method not in overriders and not cells[column].startswith("—"):
                problems.append(f"{column}: the table has an override of {method}; no class of the MRO defines it")
        column_names = {name for cells in table.values() for name in re.findall(r"`([A-Z]\w+)`", cells[column])}
        listed = column_names & mixins
        expected = {k.__name__ for k in own[1:]} - {"TrlExtGRPOTrainer"}
        if listed != expected:
            problems.append(f"{column}: the MRO's mixins are {sorted(expected)}; the table names {sorted(listed)}")
        for name in sorted(column_names - mixins):
            if not any(isinstance(getattr(m, name, None), type) for m in modules):
                problems.append(f"{column}: the table names {name}, which no trl_ext module defines")
    assert problems == []

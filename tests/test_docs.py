"""The documents are a reference: complete against the code, current, closed on the repository.

- Every GATEWAY_* setting, metric (with its labels), HTTP route and CLI flag appears in its
  reference page; the generated parts (scripts/gen_docs.py, `make docs`) are what the code
  generates now.
- Every link in the README, CHANGELOG and docs/ resolves inside the repository (anchors included);
  none points outside it. Every `make` target the documents name exists, and every flag a documented
  command line passes is one its command takes.
- The README stays a front page (≤ 12 KB); committed results and docs carry no machine's paths.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from backend.settings import ENV_NAMES
from ops.procs import REPO

DOCS = REPO / "docs"
REFERENCE = DOCS / "reference"
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
README_LIMIT = 12 * 1024


@cache
def gen_docs() -> ModuleType:
    """Return scripts/gen_docs.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def helps() -> dict[str, str]:
    """Return every documented command's --help, as the code prints it now."""
    result: dict[str, str] = gen_docs().all_helps()
    return result


def page(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# --- the README ---------------------------------------------------------------------------------


def test_the_readme_fits_on_a_few_screens() -> None:
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes: move detail into docs/"


# --- complete against the code ------------------------------------------------------------------


def gunicorn_conf_names() -> list[str]:
    """Return every GATEWAY_* name docker/gunicorn.conf.py spells as a string (read through
    os.environ or a helper of its own, such as ``_seconds``), found from its syntax tree: not the
    generator's own search, so a name the generator misses fails the test below."""
    tree = ast.parse((REPO / "docker" / "gunicorn.conf.py").read_text(encoding="utf-8"))
    return [
        node.value for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and re.fullmatch(r"GATEWAY_[A-Z0-9_]+", node.value)
    ]  # fmt: skip


def test_the_gunicorn_settings_read_through_helpers_are_found() -> None:
    """The three read through ``_seconds("…")`` were missing from the reference (issue 41)."""
    found = set(gunicorn_conf_names())
    assert {"GATEWAY_KEEPALIVE_S", "GATEWAY_HEADER_TIMEOUT_S", "GATEWAY_BODY_TIMEOUT_S"} <= found
    assert found - set(ENV_NAMES) <= set(gen_docs().gunicorn_variables())


def test_every_setting_is_in_the_configuration_reference() -> None:
    text = page(REFERENCE / "configuration.md")
    names = [*ENV_NAMES, *gunicorn_conf_names()]
    missing = [name for name in names if f"| `{name}` |" not in text]
    assert not missing, f"settings missing from docs/reference/configuration.md: {missing}"


def test_every_gateway_metric_and_its_labels_are_in_the_metrics_reference() -> None:
    text = page(REFERENCE / "metrics.md")
    rows = gen_docs().gateway_metric_rows() + gen_docs().modelserver_metric_rows()
    assert len(rows) > 20
    for name, _, labels, _ in rows:
        line = next((ln for ln in text.splitlines() if ln.startswith(f"| `{name}` |")), None)
        assert line is not None, f"metric {name} missing from docs/reference/metrics.md"
        assert labels in line, f"{name}: labels {labels} not in its row: {line}"


def test_every_route_is_in_the_http_reference_and_the_committed_openapi() -> None:
    text = page(REFERENCE / "http-api.md")
    committed = json.loads(page(REFERENCE / "openapi.json"))["paths"]
    for path, methods, summary in gen_docs().route_rows():
        assert f"| `{path}` | {methods} |" in text, f"route {path} missing from http-api.md"
        if "not in the OpenAPI document" not in summary:
            assert path in committed, f"route {path} missing from docs/reference/openapi.json"


def test_every_cli_flag_is_in_the_cli_reference() -> None:
    documented = page(REFERENCE / "cli.md") + page(REFERENCE / "model-server.md")
    for command, text in helps().items():
        flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", text))
        missing = sorted(flag for flag in flags if flag not in documented)
        assert not missing, f"{command}: flags missing from docs/reference: {missing}"


def test_every_model_json_key_the_exporter_writes_is_in_the_model_format_reference() -> None:
    text = page(REFERENCE / "model-format.md")
    keys: set[str] = set()
    for source in (REPO / "export" / "build.py", REPO / "modelformat" / "heads.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "info"
                and isinstance(node.value, ast.Dict)
            ):
                keys |= {str(k.value) for k in node.value.keys if isinstance(k, ast.Constant)}
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Name)
                and node.value.id == "info"
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.slice, ast.Constant)
            ):
                keys.add(str(node.slice.value))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "update":
                keys |= {kw.arg for kw in node.keywords if kw.arg}
    for demo in sorted((REPO / "models").glob("*/*/assets/model.json")):
        keys |= set(json.loads(demo.read_text(encoding="utf-8")))
    assert {"task", "bucket_signatures", "early_exit", "thresholds"} <= keys
    missing = sorted(key for key in keys if f"`{key}`" not in text)
    assert not missing, f"model.json keys missing from docs/reference/model-format.md: {missing}"


# --- current ------------------------------------------------------------------------------------


def test_the_generated_reference_is_current() -> None:
    stale = [
        str(path.relative_to(REPO))
        for path, text in gen_docs().generated_pages(helps()).items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"stale generated docs (run `make docs`): {stale}"


def test_a_missing_setting_meaning_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    module = gen_docs()
    monkeypatch.delitem(module.SETTING_MEANINGS, "GATEWAY_TIMEOUT_S")
    with pytest.raises(SystemExit, match="GATEWAY_TIMEOUT_S"):
        module.settings_rows()


def test_a_setting_missing_from_the_page_is_found(tmp_path: Path) -> None:
    """The check above bites: the page without one setting's row is stale and incomplete."""
    text = page(REFERENCE / "configuration.md")
    cut = "".join(ln for ln in text.splitlines(True) if "`GATEWAY_ROUTING_FILE`" not in ln)
    assert cut != text
    assert gen_docs().replace_block(cut, "settings", gen_docs().configuration_table()) == text


# --- closed on the repository --------------------------------------------------------------------


def slugs(markdown: str) -> set[str]:
    """Return the anchors GitHub gives the headings of a page."""
    found = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page(path), flags=re.S)
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves_inside_the_repository(path: Path) -> None:
    broken = []
    for target in links(path):
        if re.match(r"[a-z]+:", target):
            broken.append(f"{target} (outside the repository)")
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists() or not resolved.is_relative_to(REPO):
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in slugs(page(resolved)):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{path.relative_to(REPO)}: {broken}"


def test_nothing_points_at_documents_outside_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    pattern = re.compile(r"DESIGN\.md|\.\./shared/|shared/reference")
    hits = [
        name
        for name in tracked
        if name.endswith((".py", ".md", ".yaml", ".txt", ".config", "Makefile"))
        and name != "tests/test_docs.py"
        and (REPO / name).is_file()
        and pattern.search((REPO / name).read_text(encoding="utf-8", errors="replace"))
    ]
    assert not hits, f"pointers outside the repository (point into docs/ instead): {hits}"


def test_no_machine_paths_in_committed_results_and_docs() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "results", "docs", "README.md", "CHANGELOG.md"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    pattern = re.compile(r"(?<![\w.])/(?:work|root|home)/")
    hits = [
        name
        for name in tracked
        if not name.endswith(".png")
        and (REPO / name).is_file()
        and pattern.search((REPO / name).read_text(encoding="utf-8", errors="replace"))
    ]
    assert not hits, f"machine paths in committed files: {hits}"


# --- the commands the documents show -------------------------------------------------------------


def code_lines() -> list[tuple[str, str]]:
    """Return (page, command line) for every line of every code block, continuations joined."""
    found = []
    for path in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for block in re.findall(r"```(?:bash|sh|text)?\n(.*?)```", page(path), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                found.append((str(path.relative_to(REPO)), line.split("#")[0].strip()))
    return found


def make_targets() -> set[str]:
    makefile = page(REPO / "Makefile")
    return set(re.findall(r"^([a-zA-Z][\w-]*):", makefile, re.M))


def test_every_make_target_the_documents_name_exists() -> None:
    targets = make_targets()
    named = set()
    for path in PAGES:
        named |= set(re.findall(r"`make ([a-z][\w-]*)", page(path)))
    for _, line in code_lines():
        named |= set(re.findall(r"^make ([a-z][\w-]*)", line))
    assert named, "no make targets found in the documents"
    assert not sorted(named - targets), f"make targets that do not exist: {sorted(named - targets)}"


def documented_command(line: str) -> str | None:
    """Return the cli.md command a command line runs, or None when it is not one of ours."""
    commands = sorted(helps(), key=len, reverse=True)
    words = line.replace(".venv/bin/python", "python").replace("python3", "python")
    for command in commands:
        if re.search(rf"(?:^|\s){re.escape(command)}(?:\s|$)", words):
            return command
    return None


def test_every_flag_a_documented_command_passes_is_one_it_takes() -> None:
    checked = 0
    wrong = []
    for where, line in code_lines():
        command = documented_command(line)
        if command is None:
            continue
        own = line.split(" -- ", 1)[0]  # after `--`, flags go to another command (the exporter)
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", own):
            checked += 1
            if flag not in helps()[command]:
                wrong.append(f"{where}: {command} {flag}")
    assert checked > 20, "the documents' command lines were not found"
    assert not wrong, f"flags the command does not take: {wrong}"


def test_the_documented_scripts_and_modules_exist() -> None:
    missing = []
    for where, line in code_lines():
        for script in re.findall(r"scripts/[\w-]+\.(?:py|sh)", line):
            if not (REPO / script).is_file():
                missing.append(f"{where}: {script}")
        for module in re.findall(r"python -m ([\w.]+)", line.replace(".venv/bin/python", "python")):
            if importlib.util.find_spec(module) is None:
                missing.append(f"{where}: {module}")
    assert not missing, missing


def test_the_drills_page_counts_the_drills_make_drills_runs() -> None:
    makefile = page(REPO / "Makefile")
    recipe = makefile.split("\ndrills:", 1)[1].split("\n\n", 1)[0]
    scripts = re.findall(r"scripts/(\w+_drill)\.py", recipe)
    words = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    text = page(DOCS / "operations" / "drills.md")
    assert f"`make drills` runs {words[len(scripts)]} drills" in text
    assert all(f"scripts/{name}.py" in text for name in scripts)


def test_the_readme_performance_figures_are_the_performance_pages() -> None:
    """The README's summary quotes the current table; a figure it shows must be there too."""
    readme = page(REPO / "README.md").split("## Performance", 1)[1].split("\n## ", 1)[0]
    current = page(DOCS / "performance" / "index.md")
    rows = [line for line in readme.splitlines() if line.startswith("| ") and "---" not in line]
    figures = {f for row in rows[1:] for f in re.findall(r"\d+(?:\.\d+)?×?", row)}
    assert figures, "no figures in the README's performance table"
    missing = sorted(f for f in figures if f not in current)
    assert not missing, f"README figures not in docs/performance/index.md: {missing}"


def test_every_issue_the_repository_cites_is_in_the_changelog() -> None:
    """A cited "issue 23" resolves: CHANGELOG.md lists it under the release that closed it."""
    changelog = page(REPO / "CHANGELOG.md")
    groups = re.findall(r"issues? ([\d, ]+)", changelog)
    listed = {int(n) for group in groups for n in re.findall(r"\d+", group)}
    cited = subprocess.run(
        ["git", "grep", "-ohiE", r"issues? [0-9]+"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    numbers = {int(n) for n in re.findall(r"\d+", cited)}
    assert numbers, "no issue citations found"
    assert not sorted(numbers - listed), f"issues cited but not in CHANGELOG.md: {numbers - listed}"


# --- what the documents name exists --------------------------------------------------------------

# Pages whose prose names repository paths: the docs, the README and the packages' READMEs (the
# CHANGELOG names files as they were when a release shipped).
NAMING_PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md")), *sorted(REPO.glob("*/README.md"))]
PATH_TOKEN = re.compile(r"(?<![\w./~$:@-])((?:[\w.-]+/)+[\w.*-]*[\w*])")
FILE_SUFFIX = re.compile(r"\.(?:md|py|txt|yaml|yml|json|toml|sh|config|proto|tsv|jsonl|png|csv)$")
# paths that are not the repository's: inside a model version or a checkpoint, or written by a run
NOT_REPOSITORY_PATHS = re.compile(
    r"^(?:assets|assets\.extra|variables|1_Pooling|2_Dense|my-checkpoint|ckpt|run)/"
    r"|^serving_config/routing\.yaml$"  # the first rollout step writes it (docs/guides/rollouts.md)
    r"|^deploy/k8s/overlays/mine(?:/|$)"  # the overlay the Kubernetes runbook has you write
)


def top_level_directories() -> set[str]:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return {name.split("/", 1)[0] for name in tracked if "/" in name}


def ignored(path: str) -> bool:
    """Whether git ignores ``path``: what a run writes (.stack/, results/*.json, run/)."""
    return (
        subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, check=False).returncode == 0
    )


def named_paths(path: Path, tops: set[str]) -> set[str]:
    """Return the repository paths ``path`` names: under a top-level directory, or a file name."""
    found = set()
    for token in PATH_TOKEN.findall(page(path)):
        token = token.rstrip(".")
        if token.split("/", 1)[0] not in tops and not FILE_SUFFIX.search(token):
            continue
        if not re.search(r"[<>{}]|\.\.\.|…", token):  # a pattern, not a path
            found.add(token)
    return found


@pytest.mark.parametrize("path", NAMING_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_page_names_exists(path: Path) -> None:
    tops = top_level_directories()
    missing = []
    for name in sorted(named_paths(path, tops)):
        places = [REPO / name, path.parent / name, DOCS / name]
        if "*" in name and any(REPO.glob(name)):
            continue
        if any(place.exists() for place in places) or NOT_REPOSITORY_PATHS.search(name):
            continue
        if not ignored(name):
            missing.append(name)
    assert not missing, f"{path.relative_to(REPO)} names paths that do not exist: {missing}"


def test_a_dead_path_is_found(tmp_path: Path) -> None:
    """The check above bites: a page naming a test file that was removed is caught."""
    fake = tmp_path / "page.md"
    fake.write_text("Run tests/deploy/test_monitoring.py and see batching/README.md.\n")
    names = named_paths(fake, top_level_directories())
    assert {"tests/deploy/test_monitoring.py", "batching/README.md"} <= names
    assert not (REPO / "tests/deploy/test_monitoring.py").exists()


@cache
def bench_groups() -> list[str]:
    """Return what scripts/bench.py's --only takes."""
    spec = importlib.util.spec_from_file_location("bench", REPO / "scripts" / "bench.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    groups: list[str] = module.groups()
    return groups


def test_every_bench_group_a_page_names_is_one_bench_runs() -> None:
    """`scripts/bench.py --only X` in a page (results' pages too) names a group bench.py has."""
    pages = [*NAMING_PAGES, *sorted((REPO / "results").glob("*.md"))]
    wrong = []
    for path in pages:
        for names in re.findall(r"bench\.py --only ((?:[a-z][\w]* ?)+)", page(path)):
            wrong += [
                f"{path.relative_to(REPO)}: {name}"
                for name in names.split()
                if name not in bench_groups()
            ]
    assert "e2e" in bench_groups() and "e2e_bench" not in bench_groups()
    assert not wrong, f"--only names bench.py does not have: {wrong}"


# --- every error status the gateway answers is in the HTTP reference -----------------------------


def gateway_statuses() -> set[int]:
    """Return every status backend/errors.py and backend/httpworker.py can answer with."""
    found: set[int] = set()
    tree = ast.parse((REPO / "backend" / "errors.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "status_code"
            and isinstance(node.value, ast.Constant)
        ):
            found.add(int(node.value.value))
        if isinstance(node, ast.Dict):  # _HTTP_ERRORS: werkzeug's statuses it maps
            found |= {k.value for k in node.keys if isinstance(k, ast.Constant)
                      and isinstance(k.value, int)}  # fmt: skip
    worker = (REPO / "backend" / "httpworker.py").read_text(encoding="utf-8")
    found |= {int(s) for s in re.findall(r"HTTP/1\.1 (\d{3}) ", worker)}
    return found


def gunicorn_statuses() -> set[int]:
    """Return the statuses gunicorn's own request-parsing errors answer with."""
    spec = importlib.util.find_spec("gunicorn.workers.base")
    assert spec and spec.origin
    source = Path(spec.origin).read_text(encoding="utf-8")
    return {400} | {int(s) for s in re.findall(r"status_int = (\d{3})", source)}


def test_every_error_status_is_in_the_http_reference() -> None:
    text = page(REFERENCE / "http-api.md")
    ours = gateway_statuses()
    assert {401, 403, 405, 408, 413, 415, 422, 429, 503, 504} <= ours
    missing = sorted(status for status in ours if f"\n| {status} | `" not in text)
    assert not missing, f"gateway statuses without a row in http-api.md's errors table: {missing}"
    gunicorn = text.split("gunicorn answers a request it can't parse", 1)[1].split("\n\n", 1)[0]
    theirs = sorted(s for s in gunicorn_statuses() - {500} if not re.search(rf"\b{s}\b", gunicorn))
    assert not theirs, f"gunicorn's statuses missing from http-api.md: {theirs}"


# --- every alert has a runbook -------------------------------------------------------------------


def alert_rules() -> list[dict[str, Any]]:
    rules_file = REPO / "deploy" / "k8s" / "base" / "monitoring" / "alerts.yaml"
    groups = yaml.safe_load(rules_file.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_every_alert_has_a_runbook_section_in_troubleshooting() -> None:
    rules = alert_rules()
    assert len(rules) >= 7
    troubleshooting = DOCS / "operations" / "troubleshooting.md"
    wrong = []
    for rule in rules:
        url = rule.get("annotations", {}).get("runbook_url", "")
        file, _, anchor = url.partition("#")
        if REPO / file != troubleshooting or anchor not in slugs(page(troubleshooting)):
            wrong.append(f"{rule['alert']}: {url or 'no runbook_url'}")
            continue
        section = page(troubleshooting).split(f"### {rule['alert']}\n", 1)[-1].split("\n##", 1)[0]
        if "**Look at**" not in section or "**Do**" not in section:
            wrong.append(f"{rule['alert']}: its section says neither what to look at nor do")
    assert not wrong, f"alerts without a runbook: {wrong}"


# --- no documented step writes into a tracked file -----------------------------------------------

# What a fenced block that holds commands is labelled ("" for the unlabelled ones).
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
# What ends one simple command and starts the next, as shlex splits punctuation.
SEPARATORS = {"|", "||", "&&", ";", "&", "|&", "(", ")", ";;"}
REDIRECTS = {">", ">>", ">|", "&>", "&>>"}


def shell_lines(path: Path) -> list[str]:
    """Return the command lines of a page's shell and unlabelled fenced blocks (indented fences
    in lists too), continuations joined."""
    blocks: list[tuple[str, str]] = []  # (language, text)
    open_fence = False
    for line in page(path).splitlines():
        if line.strip().startswith("```"):
            if not open_fence:
                blocks.append((line.strip()[3:].strip(), ""))
            open_fence = not open_fence
        elif open_fence:
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + line + "\n")
    return [line for language, text in blocks if language in SHELL_FENCES
            for line in text.replace("\\\n", " ").splitlines() if line.strip()]  # fmt: skip


def written_paths(line: str) -> list[str]:
    """Return the files a shell command line writes: redirection targets, tee's files, the
    destination of cp, mv and install (a directory's: the file each source becomes there), dd's
    of=. Raise ValueError for a line a shell would not parse (unbalanced quotes)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    written: list[str] = []
    tokens = list(lexer)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in SEPARATORS:
            commands.append([])
        elif token in REDIRECTS and i + 1 < len(tokens):
            written.append(tokens[i + 1])
            i += 1
        elif token in {"<", "<<", "<<<", ">&", "<&"} and i + 1 < len(tokens):
            i += 1  # an input, or a descriptor's copy
        else:
            commands[-1].append(token)
        i += 1
    for argv in commands:
        while argv and (argv[0] == "sudo" or re.fullmatch(r"\w+=.*", argv[0])):
            argv = argv[1:]
        if not argv:
            continue
        name, args = Path(argv[0]).name, [a for a in argv[1:] if not a.startswith("-")]
        if name == "tee":
            written += args
        elif name == "dd":
            written += [a.removeprefix("of=") for a in argv[1:] if a.startswith("of=")]
        elif name in {"cp", "mv", "install"}:
            target = next((argv[k + 1] for k, a in enumerate(argv[:-1]) if a == "-t"), None)
            target = target or next((a.split("=", 1)[1] for a in argv
                                     if a.startswith("--target-directory=")), None)  # fmt: skip
            sources = [a for a in args if a != target]
            if target is None and len(sources) >= 2:
                target, sources = sources[-1], sources[:-1]
            if target is not None and (target.endswith("/") or (REPO / target).is_dir()):
                written += [f"{target.rstrip('/')}/{Path(s).name}" for s in sources]
            elif target is not None:
                written.append(target)
    return written


@pytest.mark.parametrize(
    ("line", "paths"),
    [
        ("head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \\n' > a/b", ["a/b"]),
        ("python x.py 2>&1 >> log.txt; echo done", ["log.txt"]),
        ("cmd 2>err.txt", ["err.txt"]),
        ("echo x | sudo tee -a one two", ["one", "two"]),
        ("cp -r a b deploy/k8s/base/", ["deploy/k8s/base/a", "deploy/k8s/base/b"]),
        ("cp a deploy/k8s/base", ["deploy/k8s/base/a"]),
        ("mv -t dir/ a", ["dir/a"]),
        ("X=1 install -m 600 k dest.txt && dd if=/dev/zero of=disk.img", ["dest.txt", "disk.img"]),
        ("kubectl create secret generic s --from-file=password=/dev/stdin < pw", []),
        ("curl -s localhost:8000/readyz", []),
    ],
)
def test_written_paths_finds_what_a_command_line_writes(line: str, paths: list[str]) -> None:
    assert written_paths(line) == paths


def tracked_files() -> set[str]:
    """Return the repository's tracked files (`git ls-files`), relative to its root."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return set(listed.stdout.decode().split("\0")) - {""}


def test_no_documented_step_writes_into_a_tracked_file() -> None:
    """A runbook step that writes a file of the checkout (a password, a key) puts it where
    `git commit -a` commits it (issue 48 item 3): what a step writes goes to an ignored path,
    outside the repository, or to the cluster (`kubectl create secret`)."""
    tracked = tracked_files()
    pages = sorted(REPO / p for p in tracked if p.endswith(".md") and p != "CHANGELOG.md")
    writes, wrong = 0, []
    for path in pages:
        for line in shell_lines(path):
            try:
                paths = written_paths(line)
            except ValueError:  # not shell (a diagram, an answer): nothing a reader runs
                continue
            for written in paths:
                if written.startswith(("/", "~", "$")) or not re.fullmatch(r"[\w./-]+", written):
                    continue  # outside the checkout, or a placeholder
                writes += 1
                relative = Path(written).as_posix().removeprefix("./")
                if relative in tracked:
                    wrong.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert writes >= 1, "no documented step writes a file: the pages' commands were not read"
    assert not wrong, "documented steps writing into tracked files:\n" + "\n".join(wrong)

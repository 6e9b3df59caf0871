"""The docs' examples run, like doctests, so the docs cannot drift from the code.

Every fenced block of README.md and docs/*.md names its language. Blocks in
the languages below run, page by page, in a fresh temporary folder:

- ``python``: executed in order in one namespace per page (one fresh Python
  process), so a page's examples build on each other; ``pycon`` blocks run
  as doctests in the same namespace, their output compared.
- ``toml``: loaded as a configuration (``jobdeck.core.config.load``) and built into a
  deck, so every key and value shown is accepted. The job types it names
  are added to ``external_types`` (the example's handlers live elsewhere).
- ``sh``: run in order in one bash script per page (``set -euo pipefail``)
  against a real ``jobdeck serve``: the script's ``jobdeck serve ...``
  starts one in the background on a free port (with ``--bind``; on waitress,
  which starts in half granian's time, unless the command names a server)
  and waits for its health; a later ``jobdeck serve`` replaces it. ``localhost:8000``
  and ``127.0.0.1:8000`` in the page's commands and files read as that
  port, and ``curl`` fails on an HTTP error (``--fail-with-body``).
- A block with a title (```` ```python title="myjobs.py" ````) is a file: it
  is written under that name, where the page's commands and code find it,
  instead of being run by itself (a ``toml`` one is also loaded as above).

A block that cannot run here is preceded by ``<!-- not run: the reason -->``
(it installs packages, needs another host, runs until stopped...). A block
without a language, in a language not listed here, or marked without a
reason fails the test: nothing is skipped silently. The README's first two
blocks are its install and test commands: the suite itself runs from them
(``.ci/run`` runs the second).

Run one page by hand: ``python tests/test_docs_examples.py docs/handlers.md``.
"""

from __future__ import annotations

import doctest
import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # other processes and builds: left out of the quick tier

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN = {"python", "pycon", "toml", "sh"}
"""Languages whose blocks run."""
FILES = {"python", "toml", "javascript", "sh"}
"""Languages a titled block (a file) may be written in."""
SHOWN = {"json", "yaml", "text", "sql"}
"""Languages that are data or output, not code: shown, never run."""
README_COMMANDS = 2
"""The README's first blocks: its install and test commands (see the module doc)."""
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>.*?)\s*-->")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
TITLE = re.compile(r'title="(?P<title>[^"]+)"')
DEFAULT_ADDRESS = re.compile(r"\b(?:localhost|127\.0\.0\.1):8000\b")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    """The line of the block's first line of code, 1-based."""
    lang: str
    title: str | None
    code: str
    not_run: str | None
    """The reason given in ``<!-- not run: ... -->``; None when it runs."""

    @property
    def where(self) -> str:
        page = self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page.name
        return f"{page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, with the marker on the line before it."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    previous = ""
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        indent, fence, info = match["indent"], match["fence"], match["info"].strip()
        end = i + 1
        while end < len(lines) and not (
            lines[end].strip().startswith(fence) and lines[end].strip().strip(fence[0]) == ""
        ):
            end += 1
        code = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end])
        lang = info.split()[0].strip("{}.") if info else ""
        title = TITLE.search(info)
        marker = NOT_RUN.fullmatch(previous)
        found.append(
            Block(
                page, i + 2, lang, title["title"] if title else None, code + "\n", marker["reason"] if marker else None
            )
        )
        previous = ""
        i = end + 1
    return found


def problems(page: Path) -> list[str]:
    """What makes a page's blocks neither runnable nor explicitly not run."""
    found = []
    for block in blocks(page)[README_COMMANDS if page.name == "README.md" else 0 :]:
        if block.not_run is not None:
            if not block.not_run:
                found.append(f"{block.where}: <!-- not run: --> needs a reason")
        elif block.title is not None and block.lang not in FILES:
            found.append(f"{block.where}: a file in {block.lang or 'no language'}; files are {sorted(FILES)}")
        elif block.title is None and block.lang not in RUN | SHOWN:
            found.append(
                f"{block.where}: a block in {block.lang or 'no language'!r}: name a language "
                f"(runs: {sorted(RUN)}; shown: {sorted(SHOWN)}) or mark it <!-- not run: why -->"
            )
    return found


def runnable(page: Path) -> list[Block]:
    skip = README_COMMANDS if page.name == "README.md" else 0
    return [b for b in blocks(page)[skip:] if b.not_run is None and (b.lang in RUN or b.title)]


# -- the Python phase: python, pycon and toml blocks in one fresh process ------------------


def _check_toml(block: Block, workdir: Path) -> None:
    """The block is a configuration Jobdeck accepts, every table and key of it."""
    from jobdeck.core.config import load
    from jobdeck.deck import Jobdeck

    data = tomllib.loads(block.code)
    types = set(data.get("types", {}))
    types |= {s["type"] for s in data.get("schedules", []) if "type" in s}
    for workflow in data.get("workflows", {}).values():
        if isinstance(workflow, dict):
            types |= {job["type"] for job in workflow.get("jobs", [])}
    path = workdir / f"config-{block.line}.toml"
    path.write_text(block.code)
    overrides = {"external_types": sorted(types | set(data.get("external_types", [])))}
    if "database_url" not in data:
        overrides["database_url"] = f"sqlite:///{workdir / 'config-check.db'}"
    deck = Jobdeck.of(load(path, env={}, overrides=overrides), init_db=False)
    deck.store.engine.dispose()


def run_python(page: Path, workdir: Path) -> None:
    """Run the page's Python, doctests and configs in this process, in order."""
    os.chdir(workdir)
    sys.path.insert(0, str(workdir))
    namespace: dict[str, object] = {"__name__": "__main__"}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for block in runnable(page):
        if block.title:
            (workdir / block.title).write_text(block.code)
        if block.lang == "toml":
            try:
                _check_toml(block, workdir)
            except Exception as exc:
                raise SystemExit(f"{block.where}: the configuration is refused: {exc}") from exc
        elif block.lang == "python" and not block.title:
            code = compile("\n" * (block.line - 1) + block.code, str(block.page), "exec")
            exec(code, namespace)
        elif block.lang == "pycon":
            test = doctest.DocTestParser().get_doctest(block.code, namespace, block.where, str(page), block.line - 1)
            result = runner.run(test, clear_globs=False)
            if result.failed:
                raise SystemExit(f"{block.where}: the doctest failed (above)")


# -- the shell phase: files and sh blocks in one bash script, with a real server -----------

SHELL_PRELUDE = r"""
set -euo pipefail
SERVER=""
SERVES=0
curl() { command curl --fail-with-body --silent --show-error --max-time 30 "$@"; }
stop_server() {
    if [ -n "$SERVER" ]; then
        kill -TERM "$SERVER" 2>/dev/null || true
        wait "$SERVER" || true
        SERVER=""
    fi
}
jobdeck() {
    if [ "${1:-}" != serve ]; then command jobdeck "$@"; return; fi
    shift
    stop_server
    SERVES=$((SERVES + 1))
    command jobdeck serve --server waitress "$@" --bind "127.0.0.1:$PORT" >"serve-$SERVES.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 1 400); do
        command curl -fs "http://127.0.0.1:$PORT/api/health" >/dev/null 2>&1 && return 0
        kill -0 "$SERVER" 2>/dev/null || { cat "serve-$SERVES.log" >&2; echo "jobdeck serve exited" >&2; return 1; }
        sleep 0.05
    done
    cat "serve-$SERVES.log" >&2
    echo "jobdeck serve did not answer within 20 s" >&2
    return 1
}
trap stop_server EXIT
"""


def shell_script(page: Path, port: int) -> str | None:
    """The page's files and commands as one script; None when it has none."""
    parts = []
    for block in runnable(page):
        code = DEFAULT_ADDRESS.sub(f"127.0.0.1:{port}", block.code)
        if block.title:
            parts.append(
                f"echo '### {block.where} ({block.title})' >&2\ncat > {block.title} <<'DOCS_EOF'\n{code}DOCS_EOF"
            )
        elif block.lang == "sh":
            parts.append(f"echo '### {block.where}' >&2\n{code}")
    return SHELL_PRELUDE + "\n".join(parts) + "\n" if parts else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without JOBDECK_* settings, which would change what the examples do."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    # The commands' python3 and jobdeck are this interpreter's, activated or not.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # Not the checkout: there its folder app/ imports as ``app``, and an example written
    # ``from app import ...`` would pass here and fail for every user of the installed package.
    env.pop("PYTHONPATH", None)
    return {**env, **extra}


def run_page(page: Path, tmp: Path) -> list[str]:
    """Run a page's examples; the failures, each with its output."""
    failures = []
    python_dir, shell_dir = tmp / "python", tmp / "shell"
    python_dir.mkdir()
    shell_dir.mkdir()
    if any(b.lang in {"python", "pycon", "toml"} for b in runnable(page)):
        out = subprocess.run(
            [sys.executable, __file__, str(page), str(python_dir)],
            cwd=python_dir,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if out.returncode != 0:
            failures.append(f"python examples of {page.name} failed:\n{out.stdout}{out.stderr}")
    port = free_port()
    script = shell_script(page, port)
    if script is not None:
        if "node " in script and shutil.which("node") is None:
            failures.append(f"{page.name} runs a Node.js example and node is not installed (apt-get install nodejs)")
            return failures
        (shell_dir / "examples.sh").write_text(script)
        out = subprocess.run(
            ["bash", "examples.sh"],
            cwd=shell_dir,
            env=clean_env(PORT=str(port)),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if out.returncode != 0:
            logs = "".join(f"\n--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(shell_dir.glob("serve-*.log")))
            failures.append(f"shell examples of {page.name} failed:\n{out.stdout[-4000:]}{out.stderr[-4000:]}{logs}")
    return failures


# -- the tests ------------------------------------------------------------------------------


def _ids(pages: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in pages]


def test_every_block_runs_or_says_why_not() -> None:
    found = [p for page in PAGES for p in problems(page)]
    assert not found, "\n".join(found)


def test_blocks_marked_not_run_are_few() -> None:
    """The marker is for what truly cannot run here (installs, other hosts,
    servers that never stop); listed so a reader of the test output sees them."""
    marked = [f"{b.where}: {b.not_run}" for page in PAGES for b in blocks(page) if b.not_run is not None]
    ran = [b for page in PAGES for b in runnable(page)]
    print("\nnot run:\n" + "\n".join(marked))
    assert len(ran) > len(marked), f"more examples are marked not run ({len(marked)}) than run ({len(ran)})"


def test_the_marker_check_catches_an_unmarked_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# P\n\n```\nrm -rf /\n```\n\n<!-- not run: -->\n```python\nprint(1)\n```\n")
    found = problems(page)
    assert len(found) == 2, found
    assert "no language" in found[0] and "needs a reason" in found[1]


@pytest.mark.parametrize(
    ("example", "says"),
    [
        ("```pycon\n>>> 1 + 1\n3\n```", "Expected:\n    3\nGot:\n    2"),
        ("```python\nassert 1 + 1 == 3\n```", "AssertionError"),
        ("```toml\nno_such_key = 1\n```", "no_such_key: unknown configuration key"),
        ("```sh\njobdeck serve --workers 0\ncurl -s localhost:8000/api/jobs/999\n```", "job 999 does not exist"),
    ],
    ids=["doctest", "python", "toml", "sh"],
)
def test_a_failing_example_fails(tmp_path: Path, example: str, says: str) -> None:
    """The runner is live: a wrong doctest output, a failing assertion, a
    refused config key and an HTTP error each fail their page, saying why."""
    page = tmp_path / "page.md"
    page.write_text(f"# P\n\n{example}\n")
    (tmp_path / "run").mkdir()
    failures = run_page(page, tmp_path / "run")
    assert len(failures) == 1, failures
    assert says in failures[0], failures[0]


def pytest_generate_tests(metafunc) -> None:  # type: ignore[no-untyped-def]
    if "doc" in metafunc.fixturenames:  # not "page": pytest-playwright owns that fixture name
        pages = [p for p in PAGES if runnable(p)]
        metafunc.parametrize("doc", pages, ids=_ids(pages))


def test_examples_run(doc: Path, tmp_path: Path) -> None:
    failures = run_page(doc, tmp_path)
    assert not failures, "\n\n".join(failures)


if __name__ == "__main__":
    if len(sys.argv) == 3:  # the Python phase of one page, in a fresh process
        run_python(Path(sys.argv[1]).resolve(), Path(sys.argv[2]))
    else:  # by hand: python tests/test_docs_examples.py docs/handlers.md
        import tempfile

        target = Path(sys.argv[1]).resolve()
        with tempfile.TemporaryDirectory() as tmp:
            failed = run_page(target, Path(tmp))
        print("\n\n".join(failed) or f"{target.name}: every example ran")
        sys.exit(1 if failed else 0)

"""Where the docs are: ``jobdeck serve``'s start-up line and the dashboard's footer.

The docs are the Markdown pages of ``docs/`` in Jobdeck's source, built into a
site by MkDocs (``mkdocs.yml`` beside them). A deployment may be offline, so
nothing points outside: in a checkout, ``mkdocs serve`` (the ``docs`` extra)
serves them on ``DOCS_PORT``, beside Jobdeck, and the pages read as plain
Markdown too. A wheel carries no docs; the line says where they are instead.
"""

from __future__ import annotations

from pathlib import Path

DOCS_PORT = 8001
"""Where the start-up line and the footer tell ``mkdocs serve`` to listen:
MkDocs' own default, 8000, is Jobdeck's."""
DOCS_URL = f"http://127.0.0.1:{DOCS_PORT}/"


def checkout_docs(root: Path | None = None) -> Path | None:
    """The ``docs/`` folder of the checkout this code runs from, or None
    (an installed wheel: its ``app/`` has no docs beside it)."""
    root = Path(__file__).resolve().parents[1] if root is None else root
    docs = root / "docs"
    return docs if (root / "mkdocs.yml").is_file() and (docs / "index.md").is_file() else None


def where(root: Path | None = None) -> str:
    """One line for ``jobdeck serve`` to print at start."""
    docs = checkout_docs(root)
    if docs is None:
        return "Docs: the docs/ folder of Jobdeck's source (not installed with the wheel); see its README"
    return (
        f"Docs: {docs} (Markdown); to browse them, run `python3 -m pip install -e '.[docs]' && "
        f"mkdocs serve -a 127.0.0.1:{DOCS_PORT}` in {docs.parent} and open {DOCS_URL}"
    )

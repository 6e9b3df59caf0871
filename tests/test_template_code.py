"""Templates are compiled once per process, not once per app
(``jobdeck.web.factory._CompiledTemplates``), and an edited template is
compiled afresh."""

from __future__ import annotations

from typing import Any

from jinja2 import DictLoader, Environment
from jobdeck import create_app
from jobdeck.deck import Jobdeck
from jobdeck.web.factory import _COMPILED_TEMPLATES


def _compiles(app: Any, monkeypatch: Any) -> list[str]:
    env = app.jinja_env
    seen: list[str] = []
    compile_ = env.compile

    def counting(source: Any, name: Any = None, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(name))
        return compile_(source, name, *args, **kwargs)

    monkeypatch.setattr(env, "compile", counting)
    return seen


def test_a_second_app_renders_its_pages_without_compiling_them(deck: Jobdeck, monkeypatch: Any) -> None:
    first = create_app(deck=deck)
    assert first.test_client().get("/jobs/dead").status_code == 200
    second = create_app(deck=deck)
    second_compiles = _compiles(second, monkeypatch)
    page = second.test_client().get("/jobs/dead")
    assert page.status_code == 200 and b"Dead" in page.data
    assert second_compiles == [], second_compiles


def test_an_edited_template_is_compiled_afresh() -> None:
    one = Environment(loader=DictLoader({"t.html": "one {{ x }}"}), bytecode_cache=_COMPILED_TEMPLATES)
    assert one.get_template("t.html").render(x=1) == "one 1"
    two = Environment(loader=DictLoader({"t.html": "two {{ x }}"}), bytecode_cache=_COMPILED_TEMPLATES)
    assert two.get_template("t.html").render(x=2) == "two 2"
    again = Environment(loader=DictLoader({"t.html": "one {{ x }}"}), bytecode_cache=_COMPILED_TEMPLATES)
    assert again.get_template("t.html").render(x=3) == "one 3"

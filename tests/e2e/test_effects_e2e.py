"""An unknown effect in real Chromium: a charge whose gateway timed out
sends its job to dead on the retry; a person sees the effect on the job
page, marks it not performed, retries, and watches the job complete."""

from __future__ import annotations

from typing import Any

import pytest
from jobdeck.core.states import EffectState, State
from jobdeck.jobs.handlers import JobContext
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e


def test_mark_an_unknown_effect_then_retry(make_live, registry, page, dialogs):
    @registry.handler("test.gateway", max_retries=2, backoff_base=0.05)
    def gateway(payload: dict[str, Any], ctx: JobContext) -> Any:
        def charge() -> dict[str, Any]:
            if ctx.attempt == 1:
                raise TimeoutError("gateway did not answer")
            return {"charged_by_attempt": ctx.attempt}

        return ctx.effect("charge:e2e-1", charge)

    live = make_live()
    r = page.request.post(f"{live.url}/api/jobs", data={"type": "test.gateway", "payload": {}})
    assert r.status == 201, r.text()
    job_id = r.json()["id"]
    page.goto(f"{live.url}/jobs/{job_id}")
    expect(page.locator("#job-live .badge")).to_have_text("Dead letter", timeout=20000)
    page.reload()  # the full page, with the effects as they stand
    effect = page.locator('tr.effect[data-key="charge:e2e-1"]')
    expect(effect).to_contain_text("unknown (started)")
    expect(page.locator("#job-detail")).to_contain_text(
        "effect charge:e2e-1 was started by attempt 1 and its outcome is unknown"
    )
    live.shot(page, "effect-unknown")
    effect.get_by_role("button", name="Mark not performed").click()
    expect(page.locator(".flash-success")).to_contain_text("Effect charge:e2e-1 marked not performed")
    expect(effect).to_contain_text("not performed")
    expect(effect).to_contain_text("marked by local operator")
    expect(effect.get_by_role("button", name="Mark done")).to_have_count(0)
    page.get_by_role("button", name="Retry", exact=True).click()
    expect(page.locator("#job-live .badge")).to_have_text("Completed", timeout=20000)
    expect(effect).to_contain_text("done", timeout=10000)
    expect(effect).to_contain_text('{"charged_by_attempt":3}')
    assert live.deck.store.get(job_id).status is State.COMPLETED
    assert live.deck.store.ledger.get("charge:e2e-1").state is EffectState.DONE
    page.goto(f"{live.url}/audit")
    expect(page.locator("table.audit")).to_contain_text("effect-not-performed")
    assert dialogs == []

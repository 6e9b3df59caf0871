"""Labels that must not mislead: a job that ended without a result says how
it ended instead of "No result yet", as if one might still come; a job sent
to dead with retries left says it was not retried, and why, where "1/4" read
as three retries to come; the overview's charts say when nothing ran."""

from __future__ import annotations

import re

from dashboard_support import make_dead
from jobdeck.store import Outcome
from jobdeck.web.serialize import job_json


def test_a_dead_jobs_page_says_why_it_has_no_result(dash, deck):
    job_id = make_dead(deck)  # its error: "boom", then a second line
    html = dash.get(f"/jobs/{job_id}").get_data(as_text=True)
    result = html.split('id="job-result"')[1].split("</section>")[0]
    assert "No result yet" not in result
    assert "No result: died: <bdi>boom</bdi>" in result  # the error's first line


def test_a_waiting_job_still_has_no_result_yet(dash, deck):
    job, _ = deck.enqueue("demo.noop", {})
    result = dash.get(f"/jobs/{job.id}").get_data(as_text=True).split('id="job-result"')[1].split("</section>")[0]
    assert "No result yet." in result


def test_an_empty_throughput_chart_says_nothing_ran(dash, deck):
    html = dash.get("/").get_data(as_text=True)
    assert "no runs in the last hour" in html and "peak 1/min" not in html


def _latency_axis(html: str) -> str:
    return html.split("Queue latency", 1)[1].split('class="axis"')[1].split("</div>")[0]


def test_an_empty_latency_chart_says_nothing_ran(dash, deck):
    axis = _latency_axis(dash.get("/").get_data(as_text=True))
    assert "no runs in the last hour" in axis and "peak " not in axis


def test_a_latency_chart_with_runs_but_no_wait_says_none_was_seen(dash, deck):
    job, _ = deck.enqueue("demo.noop", {})
    now = deck.clock()
    assert [j.id for j in deck.store.claim("w1", now, limit=1)] == [job.id]
    deck.store.complete(job.id, "w1", now)  # it ran before anyone looked: nothing was sampled waiting
    html = dash.get("/").get_data(as_text=True)
    axis = _latency_axis(html)
    assert "no job seen waiting" in axis and "peak " not in axis and "no runs" not in axis
    assert "peak 1/min" in html  # the throughput chart beside it has the run


def test_the_latency_peak_is_the_longest_wait_seen_not_the_scale(dash, deck, clock):
    deck.enqueue("demo.noop", {})
    clock.advance(0.3)
    axis = _latency_axis(dash.get("/").get_data(as_text=True))
    assert "peak 300 ms" in axis and "1.0 s" not in axis


def dead_not_retried(deck, error: str, max_retries: int = 3) -> int:
    """A job failed once, non-retryable, with ``max_retries`` left: dead at once."""
    job, _ = deck.enqueue("demo.fail", {}, max_retries=max_retries)
    now = deck.clock()
    assert [j.id for j in deck.store.claim("w1", now, limit=1)] == [job.id]
    deck.store.fail_many([Outcome(job.id, "w1", error=error, retryable=False)], now)
    return job.id


def attempts_field(dash, job_id: int) -> str:
    html = dash.get(f"/jobs/{job_id}").get_data(as_text=True)
    return html.split('<dd class="attempts">')[1].split("</dd>")[0]


def attempts_cell(dash, job_id: int) -> str:
    html = dash.get("/jobs/dead").get_data(as_text=True)
    row = html.split(f'id="job-{job_id}"')[1].split("</tr>")[0]
    return re.search(r'<td class="[^"]*attempts"[^>]*>.*?</td>', row, re.S).group(0)


def test_attempts_of_a_job_not_retried_say_so_and_why(dash, deck):
    note = "\n(not retried: InvalidField is non-retryable)"
    job_id = dead_not_retried(deck, "InvalidField: amount: must be a number" + note)
    assert attempts_field(dash, job_id) == "1 of 4, not retried: non-retryable InvalidField"
    cell = attempts_cell(dash, job_id)
    assert (
        ">1 of 4, not retried</td>" in cell
        and 'title="attempts 1 of 4, not retried: non-retryable InvalidField"' in cell
    )


def test_a_handlers_dead_letter_and_an_http_workers_refusal_are_named(dash, deck):
    chosen = dead_not_retried(deck, "DeadLetter: refund window closed")
    http = dead_not_retried(deck, "upstream said: do not retry", max_retries=1)
    assert attempts_field(dash, chosen) == "1 of 4, not retried: non-retryable DeadLetter"
    assert attempts_field(dash, http) == "1 of 2, not retried: marked non-retryable"


def test_a_dead_job_that_used_its_retries_reads_made_and_allowed(dash, deck, clock):
    assert attempts_field(dash, make_dead(deck)) == '1/1 <span class="muted">made / allowed</span>'
    job, _ = deck.enqueue("demo.fail", {}, max_retries=1)
    for _ in range(2):
        clock.advance(3600)
        assert [j.id for j in deck.store.claim("w1", clock.now, limit=1)] == [job.id]
        deck.store.fail_many([Outcome(job.id, "w1", error="gateway timeout")], clock.now)
    assert deck.store.get(job.id).status.value == "dead"
    assert attempts_field(dash, job.id) == '2/2 <span class="muted">made / allowed</span>'
    assert ">2/2</td>" in attempts_cell(dash, job.id)


def test_the_default_priority_has_the_apis_word_on_the_job_page(dash, deck):
    plain, _ = deck.enqueue("demo.noop", {})
    urgent, _ = deck.enqueue("demo.noop", {}, priority="high")
    for job, field in ((plain, 'low <span class="muted">(0, the default)</span>'),
                       (urgent, 'high <span class="muted">(20)</span>')):  # fmt: skip
        html = dash.get(f"/jobs/{job.id}").get_data(as_text=True)
        assert re.search(r"<dt>Priority</dt><dd[^>]*>(.*?)</dd>", html).group(1) == field
        assert field.startswith(job_json(job, deck.clock())["priority_label"] + " ")
    assert deck.enqueue("demo.noop", {}, priority="low")[0].priority == 0  # and the word is taken on input

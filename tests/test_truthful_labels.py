"""Labels that must not mislead: a job that ended without a result says how
it ended instead of "No result yet", as if one might still come."""

from __future__ import annotations

from dashboard_support import make_dead


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

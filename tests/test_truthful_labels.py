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

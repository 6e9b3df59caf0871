from jobdeck.core.states import State


def test_enqueue_and_get(client, deck):
    r = client.post("/api/jobs", json={"type": "demo.noop", "payload": {"a": 1}})
    assert r.status_code == 201, r.get_json()
    job = r.get_json()
    assert job["status"] == State.PENDING.value
    got = client.get(f"/api/jobs/{job['id']}").get_json()
    assert got["payload"] == {"a": 1}
    assert got["attempts"] == []

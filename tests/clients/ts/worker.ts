// A worker and producer in TypeScript, written against the types that
// openapi-typescript generated from a live /api/openapi.json (./jobdeck.d.ts),
// calling through openapi-fetch. tests/test_generated_clients.py generates the
// types, type-checks this file with tsc (a document change that breaks the
// types fails there), runs it against a live server, and checks the database.
//
// Runs: enqueue (and the same unique job again: a duplicate) -> claim ->
// heartbeat with a log line -> an effect started and finished -> complete; a
// job with max_retries 1: claim -> an effect performed -> fail -> claim again
// once due -> the effect skipped, with its stored result -> fail -> dead; a
// bulk enqueue of two jobs -> claim both -> complete. Prints one JSON line:
// the ids, for the test to check.

import createClient from "openapi-fetch";
import type { components, paths } from "./jobdeck.js";

type Job = components["schemas"]["Job"];
// Node's own, declared here rather than with @types/node, which would more
// than double tsc's time for these two names (fetch and its types: lib DOM).
declare const process: { env: Record<string, string | undefined>; exit(code: number): never };

const BASE = process.env.JOBDECK_URL ?? "http://127.0.0.1:8000";
const TOKEN = process.env.JOBDECK_API_TOKEN ?? "";
const WORKER = "ts-worker";
const api = createClient<paths>({ baseUrl: BASE, headers: { Authorization: `Bearer ${TOKEN}` } });

function check(condition: boolean, what: string): asserts condition {
  if (!condition) throw new Error(what);
}

function said(answer: { response: Response; error?: unknown }): string {
  return `answered ${answer.response.status} ${JSON.stringify(answer.error ?? "")}`;
}

async function claimOne(type: string): Promise<Job | null> {
  const claim = await api.POST("/api/jobs/claim", { body: { worker_id: WORKER, types: [type] } });
  check(claim.response.status === 200 && claim.data !== undefined, `claim ${said(claim)}`);
  check(!Array.isArray(claim.data), "a claim without limit answers one job or null");
  return claim.data;
}

async function claimDue(type: string, seconds: number): Promise<Job> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const job = await claimOne(type);
    if (job) return job;
    check(Date.now() < deadline, `no ${type} job came due within ${seconds} s`);
    await new Promise((resolve) => setTimeout(resolve, 20)); // a poll with a deadline
  }
}

async function complete(job: Job, result: unknown): Promise<Job> {
  const done = await api.POST("/api/jobs/{job_id}/complete", {
    params: { path: { job_id: job.id } },
    body: { worker_id: WORKER, result },
  });
  check(done.data?.status === "completed", `complete ${said(done)}`);
  return done.data;
}

async function fail(job: Job, error: string): Promise<Job> {
  const failed = await api.POST("/api/jobs/{job_id}/fail", {
    params: { path: { job_id: job.id } },
    body: { worker_id: WORKER, error, retryable: true, logs: [{ level: "error", message: error }] },
  });
  check(failed.data !== undefined, `fail ${said(failed)}`);
  return failed.data;
}

// Start the effect `key` for the job's attempt; perform it (here: return
// `result`) and finish it when told to. Returns the decision and the result.
async function effect(job: Job, key: string, result: unknown): Promise<[string, unknown]> {
  const step = { worker_id: WORKER, attempt: job.attempt };
  const path = { job_id: job.id, key };
  const begun = await api.POST("/api/jobs/{job_id}/effects/{key}/start", { params: { path }, body: step });
  check(begun.data !== undefined && begun.data.effect.key === key, `start ${said(begun)}`);
  if (begun.data.decision === "skip") return ["skip", begun.data.effect.result];
  check(begun.data.decision === "perform" && !begun.data.replayed, `start: ${begun.data.decision}`);
  const done = await api.POST("/api/jobs/{job_id}/effects/{key}/finish", {
    params: { path },
    body: { ...step, result },
  });
  check(done.data?.state === "done", `finish ${said(done)}`);
  return ["perform", done.data.result];
}

async function workedJob(): Promise<number> {
  const job = { type: "ext.resize", payload: { image: "cat.png" }, priority: "high", unique: true } as const;
  const created = await api.POST("/api/jobs", { body: job });
  check(created.response.status === 201 && created.data !== undefined, `enqueue ${said(created)}`);
  const again = await api.POST("/api/jobs", { body: job });
  check(again.response.status === 200 && again.data?.duplicate === true, `a unique job twice ${said(again)}`);
  check(again.data.id === created.data.id, "the duplicate answers the kept job");

  const claimed = await claimOne("ext.resize");
  check(claimed?.id === created.data.id && claimed.status === "running", "claim the job enqueued");
  const beat = await api.POST("/api/jobs/{job_id}/heartbeat", {
    params: { path: { job_id: claimed.id } },
    body: { worker_id: WORKER, logs: [{ level: "info", message: "resizing cat.png" }] },
  });
  check(beat.data?.cancel === false && beat.data.logs_kept === 1, `heartbeat ${said(beat)}`);
  const [decision, stored] = await effect(claimed, `thumbnail:${claimed.id}`, { bytes: 2048 });
  check(decision === "perform" && JSON.stringify(stored) === '{"bytes":2048}', `effect: ${decision}`);
  await complete(claimed, { width: 64, height: 64 });

  const shown = await api.GET("/api/jobs/{job_id}", { params: { path: { job_id: claimed.id } } });
  check(shown.data?.status === "completed" && shown.data.logs.lines === 1, `get ${said(shown)}`);
  return claimed.id;
}

async function deadJob(): Promise<number> {
  const created = await api.POST("/api/jobs", { body: { type: "ext.flaky", max_retries: 1 } });
  check(created.response.status === 201 && created.data !== undefined, `enqueue ${said(created)}`);
  const claim = await api.POST("/api/jobs/claim", { body: { worker_id: WORKER, types: ["ext.flaky"], limit: 1 } });
  check(Array.isArray(claim.data) && claim.data.length === 1, `a claim with limit answers a list ${said(claim)}`);
  const first = claim.data[0];
  check(first.id === created.data.id, "claim the job enqueued");
  const notify = `notify:${first.id}`;
  const [performed] = await effect(first, notify, { message_id: "m-1" });
  check(performed === "perform", `the first attempt's effect: ${performed}`);

  const failed = await fail(first, "the resizer timed out");
  check(failed.status === "failed" && failed.retry_count === 1, `first failure: ${failed.status}`);
  const retried = await claimDue("ext.flaky", 10);
  check(retried.id === first.id && retried.attempt === 2, "the retry is the same job's second attempt");
  const [skipped, kept] = await effect(retried, notify, { message_id: "m-2" });
  check(skipped === "skip" && JSON.stringify(kept) === '{"message_id":"m-1"}', `the retry's effect: ${skipped}`);
  const dead = await fail(retried, "the resizer timed out again");
  check(dead.status === "dead", `second failure with max_retries 1: ${dead.status}`);

  const shown = await api.GET("/api/jobs/{job_id}", { params: { path: { job_id: first.id } } });
  const outcomes = (shown.data?.attempts ?? []).map((attempt) => attempt.outcome);
  check(JSON.stringify(outcomes) === '["failed","failed"]', `attempts: ${JSON.stringify(outcomes)}`);
  return first.id;
}

async function bulkJobs(): Promise<number[]> {
  const jobs = ["a.png", "b.png"].map((image) => ({ type: "ext.resize", payload: { image } }));
  const bulk = await api.POST("/api/jobs/bulk", { body: { jobs } });
  check(bulk.response.status === 201 && bulk.data !== undefined, `bulk enqueue ${said(bulk)}`);
  const ids = bulk.data.jobs.map((job) => job.id);
  check(bulk.data.jobs.every((job) => job.created && !job.duplicate), "both jobs created");

  const claim = await api.POST("/api/jobs/claim", { body: { worker_id: WORKER, types: ["ext.resize"], limit: 2 } });
  check(Array.isArray(claim.data), `a claim with limit answers a list ${said(claim)}`);
  const claimed = claim.data.map((job) => job.id).sort((a, b) => a - b);
  check(JSON.stringify(claimed) === JSON.stringify([...ids].sort((a, b) => a - b)), `claimed ${claimed}`);
  for (const job of claim.data) await complete(job, null);
  return ids;
}

async function main(): Promise<void> {
  const worked = await workedJob();
  const dead = await deadJob();
  const bulk = await bulkJobs();
  console.log(JSON.stringify({ worked, dead, bulk }));
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});

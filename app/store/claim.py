"""The claim: due jobs to ``running`` in one statement, in claim order."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from jobdeck.store import claim_statements
from jobdeck.store.records import JobRecord, claimed_records
from jobdeck.store.sqlite import Prepared, parse_time_required, translated_errors
from jobdeck.store.timekeeping import after_waiting
from jobdeck.store.transactions import Transactions
from sqlalchemy import Connection

UNREAD = object()
"""``complete_and_claim`` has not read the claimable priorities (``Claiming.claimable_priorities``)."""


def _in_claim_order(claimed: list[JobRecord]) -> list[JobRecord]:
    claimed.sort(key=lambda j: (-j.priority, j.available_at, j.id))
    return claimed


class Claiming(Transactions):
    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.claim_policy: Callable[..., list[JobRecord]] | None = None
        """Installed by ``jobdeck.jobs.queues`` (via ``create_app``): paused queues, concurrency limits."""

    def claim(
        self,
        worker_id: str,
        now: datetime,
        *,
        limit: int = 1,
        types: Iterable[str] | None = None,
        queues: Iterable[str] | None = None,
        exclude_queues: Iterable[str] | None = None,
        controlled: bool = True,
    ) -> list[JobRecord]:
        """Claim up to ``limit`` due jobs in one statement, in claim order
        (priority DESC, available_at ASC, id ASC).

        With a ``claim_policy`` installed (``jobdeck.jobs.queues``: paused queues,
        concurrency limits) the policy claims instead; it calls back here with
        ``controlled=False`` and the paused queues in ``exclude_queues``."""
        types = None if types is None else list(types)
        queues = None if queues is None else list(queues)
        if types == [] or queues == []:
            return []  # of no type, or from no queue: nothing (an empty list does not compile into the statement)
        if controlled and self.claim_policy is not None:
            return self.claim_policy(self, worker_id, now, limit=limit, types=types, queues=queues)
        with self.single() as conn:
            return self.claim_in(conn, worker_id, now, limit, types, queues, exclude_queues)

    def claim_in(
        self,
        conn: Connection,
        worker_id: str,
        now: datetime,
        limit: int,
        types: Iterable[str] | None = None,
        queues: Iterable[str] | None = None,
        exclude_queues: Iterable[str] | None = None,
        unless: tuple[Sequence[str], Sequence[str]] = ((), ()),
    ) -> list[JobRecord]:
        """The uncontrolled claim's statement, in ``conn``'s transaction (a
        claim policy's: ``jobdeck.store.controls.claim_due``). ``unless``
        (PostgreSQL): types and queues of which the claim takes no job; it
        takes none at all when one of them is among the jobs it picks
        (``claim_statements.claim``'s ``n_unless``)."""
        type_list = None if types is None else list(types)
        queue_list = None if queues is None else list(queues)
        excluded = list(exclude_queues or ())
        # A claim held up (on SQLite, for the write lock it holds by now) or
        # landing late (on PostgreSQL: ``void_at``) stamps the time it claims
        # at, not the time its caller read before.
        now = after_waiting(self, now)
        priorities = self.claimable_priorities(conn)
        if priorities == []:
            return []  # no job is pending or failed: nothing to claim, due or not
        prepared = claim_statements.claim(
            None if type_list is None else len(type_list),
            None if queue_list is None else len(queue_list),
            len(excluded),
            self.void_after is not None,
            None if priorities is None else len(priorities),
            (len(unless[0]), len(unless[1])),
        )
        values = (
            worker_id,
            self._t(now),
            *(type_list or ()),
            *(queue_list or ()),
            *excluded,
            *(priorities or ()),
            limit,
            *unless[0],
            *unless[1],
        )
        return self._claimed(conn, prepared, values + self.void_at(now), worker_id, now)

    def claimable_priorities(self, conn: Connection) -> list[int] | None:
        """SQLite: the priorities a due read in ``conn``'s transaction names
        (``claim_statements.claimable_priorities``); None on PostgreSQL, whose
        reads name none. Inside ``complete_and_claim`` the ones it read after
        its completions: the transaction's claims only take jobs out of the
        claimable ones, so a priority read then still holds every due job."""
        if not self.sqlite:
            return None
        read: list[int] | None | object = getattr(self._joined, "priorities", UNREAD)
        if read is not UNREAD and getattr(self._joined, "conn", None) is conn:
            return read  # type: ignore[return-value]
        with translated_errors():
            return claim_statements.claimable_priorities(conn.connection.cursor())

    def claim_ids(self, conn: Connection, worker_id: str, now: datetime, ids: Sequence[int]) -> list[JobRecord]:
        """Inside the caller's write transaction (``jobdeck.jobs.queues`` picks the ids
        under its concurrency limits): claim exactly ``ids``, those still
        claimable, in claim order."""
        if self.sqlite:
            return self._claimed(
                conn, claim_statements.claim_ids(len(ids)), (worker_id, self._t(now), *ids), worker_id, now
            )
        prepared = claim_statements.claim_id_array(self.void_after is not None)
        return self._claimed(conn, prepared, (worker_id, self._t(now), list(ids), *self.void_at(now)), worker_id, now)

    def void_at(self, now: datetime) -> tuple[Any, ...]:
        """A claim's last value when it is voidable (PostgreSQL on the
        database's clock: ``Store.void_after``): the time past which it
        stamps the server's time as it lands, not ``now``
        (``claim_statements.on_time``). Nothing otherwise."""
        if self.void_after is None:
            return ()
        return (self._t(now + timedelta(seconds=self.void_after)),)

    def _claimed(
        self, conn: Connection, prepared: Prepared, values: tuple[Any, ...], worker_id: str, now: datetime
    ) -> list[JobRecord]:
        """Run a claim at driver level, its text compiled once per shape:
        Core's execution and its per-column result processing took most of
        the claiming thread's time, on both databases. (SQLite on the raw
        cursor; PostgreSQL sessions run in UTC, so the driver's times are
        what Core would give: ``jobdeck.store.engine``.)"""
        now = now.astimezone(UTC)  # as the database holds it (the records' times are UTC)
        rows = self.driver_rows(conn, prepared, values)
        return _in_claim_order(claimed_records(rows, worker_id, now, parse_time_required if self.sqlite else None))

    def driver_rows(self, conn: Connection, prepared: Prepared, values: tuple[Any, ...]) -> list[Any]:
        """Run ``prepared`` in ``conn``'s transaction at driver level: its
        text compiled once, the values positional (times as ``stored_time``
        gives them), the rows as the driver returns them (SQLite's text for times).
        For the claims and their policies' reads, where Core's compile and
        result processing cost more than the statement."""
        if self.sqlite:
            compiled = prepared.sqlite
            with translated_errors():
                rows: list[Any] = conn.connection.cursor().execute(compiled.text, compiled.params(values)).fetchall()
            return rows
        compiled = prepared.postgres
        return list(conn.exec_driver_sql(compiled.text, compiled.params(prepared.encoded(values))).fetchall())

"""The context of an ``async def`` handler: the same ``ctx``, made safe for
the pool's one event loop, which every async job of the pool shares.

- ``await ctx.aeffect(key, async_fn)`` is ``ctx.effect`` for an async side
  effect, two-phase as it is: the ledger's writes run on a thread, the
  effect itself on the loop.
- ``ctx.progress`` returns at once: its write runs on a thread, the latest
  value wins (a write still running is followed by the newest, not by each).
- ``ctx.log``, ``ctx.cancelled``, ``ctx.check_cancelled``, ``ctx.snooze``
  never touch the database. ``ctx.rate_limited`` and ``ctx.artifact`` write
  once, as from a thread; a large artifact is better kept with
  ``await asyncio.to_thread(ctx.artifact, name, data)``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable
from typing import Any

from jobdeck.core.errors import EffectNotPerformed
from jobdeck.jobs.context import JobContext
from jobdeck.jobs.effects import Decision
from jobdeck.store.effect_records import storable


class AsyncJobContext(JobContext):
    """What an ``async def`` handler gets besides its payload (see the module docstring)."""

    _progress_next: tuple[float | None, str | None] | None = None
    _progress_writer: asyncio.Task[None] | None = None

    async def aeffect(self, key: str, fn: Callable[..., Any], *, replay_safe: bool = False) -> Any:
        """``ctx.effect`` for an async side effect: ``fn()`` (``fn(key)`` with
        ``replay_safe``) returns an awaitable, awaited at most once per ``key``
        across every attempt, worker and job::

            receipt = await ctx.aeffect(f"charge:{order_id}", lambda: gateway.charge(order_id, cents))

        The same two phases and the same answers as ``effect``: the key is
        recorded ``started`` before ``fn`` runs and ``done`` with its result
        after; ``EffectNotPerformed`` withdraws it; a cancel or any other error
        while it runs leaves the outcome unknown for a person to settle."""
        if self.trace is not None:
            with self.trace.effect(key):
                return await self._aeffect(key, fn, replay_safe)
        return await self._aeffect(key, fn, replay_safe)

    async def _aeffect(self, key: str, fn: Callable[..., Any], replay_safe: bool) -> Any:
        waited_until = time.monotonic() + self.EFFECT_WAIT
        pause = 0.02
        while True:
            begun = await asyncio.to_thread(self._begin_effect, key, replay_safe)
            decision = self._decided(key, begun, waited_until)
            if decision is Decision.SKIP:
                return begun.record.result
            if decision is Decision.PERFORM:
                break
            await asyncio.sleep(pause)  # another job's attempt holds the key
            pause = min(0.5, pause * 2)
        try:
            value = fn(key) if replay_safe else fn()
            if inspect.isawaitable(value):
                value = await value
        except EffectNotPerformed:
            await asyncio.to_thread(self.store.ledger.withdraw, key, self.job_id, self.attempt, self._clock())
            raise
        stored = storable(value)
        await asyncio.to_thread(self._record_done, key, stored)
        return json.loads(stored)

    def progress(self, fraction: float | None, message: str | None = None) -> None:
        """Report progress (0..1) with an optional message; on the loop it
        returns at once and the write follows on a thread (latest wins)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called from a thread (``asyncio.to_thread``): write now
            super().progress(fraction, message)
            return
        self._progress_next = (fraction, message)
        if self._progress_writer is None:
            self._progress_writer = loop.create_task(self._write_progress())

    async def progress_written(self) -> None:
        """Wait for the progress write still running: a handler that reports
        progress and returns at once had its progress written after its job
        completed, and refused, so the job showed none."""
        writer = self._progress_writer
        if writer is not None:
            await asyncio.wait({writer})

    async def _write_progress(self) -> None:
        try:
            while self._progress_next is not None:
                (fraction, message), self._progress_next = self._progress_next, None
                try:
                    await asyncio.to_thread(JobContext.progress, self, fraction, message)
                except Exception as exc:  # shown live only; the attempt goes on
                    self.log.warning("progress not recorded (%s)", exc.__class__.__name__)
        finally:
            self._progress_writer = None

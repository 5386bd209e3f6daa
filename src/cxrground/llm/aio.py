"""asyncio helpers: run a coroutine from synchronous code, and map an async function with N workers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["bounded_each", "bounded_map", "run_sync"]

T = TypeVar("T")
R = TypeVar("R")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``; in a worker thread when this thread has a running loop (notebooks, Playwright)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def bounded_map(
    fn: Callable[[T], Awaitable[R]],
    items: Iterable[T],
    concurrency: int,
    on_done: Callable[[R], None] | None = None,
) -> list[R]:
    """``[await fn(x) for x in items]`` with at most ``concurrency`` calls in flight; results in input order.

    Each of the ``concurrency`` workers takes the next item when its previous call is done (memory stays
    bounded). ``on_done(result)`` runs after every call (progress bars). The first exception cancels the
    other workers and is raised.
    """
    todo = list(items)
    results: list[Any] = [None] * len(todo)

    async def call(numbered: tuple[int, T]) -> R:
        k, item = numbered
        results[k] = await fn(item)
        return results[k]

    await bounded_each(call, enumerate(todo), min(concurrency, max(1, len(todo))), on_done)
    return results


async def bounded_each(
    fn: Callable[[T], Awaitable[R]],
    items: Iterable[T],
    concurrency: int,
    on_done: Callable[[R], None] | None = None,
) -> int:
    """``await fn(x)`` for each ``x`` of ``items`` with at most ``concurrency`` calls in flight; returns how many.

    Unlike :func:`bounded_map`, ``items`` is read lazily and no result is kept (``on_done(result)`` sees each), so
    memory stays flat over any number of items. The first exception cancels the other workers and is raised.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    queue = iter(items)
    count = 0

    async def worker() -> None:
        nonlocal count
        for item in queue:  # one shared iterator: each worker takes the next item when it is free
            result = await fn(item)
            count += 1
            if on_done is not None:
                on_done(result)

    tasks = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return count

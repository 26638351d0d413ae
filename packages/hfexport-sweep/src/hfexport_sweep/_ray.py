"""``hfexport sweep --executor ray``: one Ray task per zoo case.

Each task runs its case exactly as the local executor does (``run_one``, the sweep's
:func:`~hfexport_sweep.sweep.run_one_case`: a case process forked from a server that imported torch,
transformers and the backend once, killed past its timeout or its memory limit) and returns the case's
record; the driver hands each record to ``on_record`` as its task finishes, which appends it to
``results.jsonl``. The driver alone reads and writes the results directory, so resume works the same
whichever executor wrote the records.

A task asks Ray for one CPU (the case process runs torch with one thread) and, with a memory limit, for that
much of Ray's ``memory`` resource, so Ray never schedules more cases on a node than its memory holds.

Ray is an optional dependency (``pip install 'hfexport-sweep[ray]'``), imported here only.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["RayClusterError", "import_ray", "run_on_ray"]


class RayClusterError(RuntimeError):
    """Ray could not be started or reached, or its cluster cannot run the sweep's tasks (before any case)."""


def import_ray(address: str | None) -> Any:
    """Import Ray for a sweep that connects to ``address`` (``None``: a new local instance unless ``RAY_ADDRESS``).

    For a new local instance, Ray's ``uv run`` integration is turned off (``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0``
    unless set): under ``uv run`` it would package the working directory and start every worker through
    ``uv run``, which a local instance, whose workers already run this interpreter, does not need (it took
    the start of a 5-case sweep from 26 s to 99 s). Connecting to a cluster keeps Ray's default, which is how
    a cluster whose nodes lack hfexport gets the driver's environment. Read when Ray is first imported.

    Returns:
        The ``ray`` module.

    Raises:
        ImportError: Ray is not installed.
    """
    if address is None and not os.environ.get("RAY_ADDRESS") and "ray" not in sys.modules:
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    import ray

    return ray


def _case_task(run_one: Callable[..., dict[str, Any]], case: Any, job: dict[str, Any], timeout: float,
               preload: list[str]) -> dict[str, Any]:
    """The body of a Ray task: the case in its own process, its record returned to the driver."""
    return run_one(case, job, timeout, preload)


@functools.cache
def _remote() -> Any:
    import ray

    # max_retries: a task is retried when its worker or node dies (a system failure), never because the case
    # failed (the case process's failures are its record, returned normally).
    return ray.remote(num_cpus=1, max_retries=2)(_case_task)


def _check_memory(ray: Any, limit: int) -> None:
    """Refuse a memory limit that no node of the cluster offers (its tasks would never be scheduled)."""
    largest = max((n.get("Resources", {}).get("memory", 0) for n in ray.nodes() if n.get("Alive")), default=0)
    if largest and limit > largest:
        raise RayClusterError(f"the memory limit of {limit / 2**30:g} GiB per case exceeds the Ray memory of every "
                         f"node (at most {largest / 2**30:.1f} GiB): no case could be scheduled")


def run_on_ray(items: list[tuple[Any, dict[str, Any]]], run_one: Callable[..., dict[str, Any]],
               on_record: Callable[[dict[str, Any]], None], on_error: Callable[[Any, dict[str, Any], BaseException],
                                                                              None],
               *, timeout: float, preload: Iterable[str], address: str | None = None,
               max_in_flight: int | None = None) -> None:
    """Run every case as a Ray task and hand each record to ``on_record`` as its task finishes.

    Args:
        items: ``(case, job)`` pairs, as for the local executor; a job's ``memory_limit`` (bytes) becomes the
            task's Ray ``memory`` request.
        run_one: ``run_one(case, job, timeout, preload) -> record``, a module-level function (Ray pickles it by
            reference, so every worker must have hfexport-sweep installed).
        on_record: called in the driver with each record, in the order tasks finish.
        on_error: called in the driver with ``(case, job, exception)`` for a task that failed as a task (its
            worker or node died past Ray's retries).
        timeout: seconds a case may take once its task runs (time queued for a CPU does not count).
        preload: modules the case process's server imports once per Ray worker.
        address: the Ray cluster to connect to (``"HOST:PORT"``, ``"ray://HOST:PORT"``, ``"auto"``); ``None``:
            the ``RAY_ADDRESS`` environment variable if set, else a new local Ray instance, stopped at the end.
            A Ray already initialised in this process is used as it is.
        max_in_flight: at most this many tasks submitted at once (``None``: all; Ray queues them).

    Raises:
        RayClusterError: Ray does not start or the cluster at ``address`` cannot be reached; a memory limit
            larger than every node's Ray memory.
        KeyboardInterrupt: interrupted; the running tasks are cancelled (their case processes killed) and
            the records already handed over stay.
    """
    ray = import_ray(address)
    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
        except Exception as exc:  # ConnectionError, ValueError (a bad address), RuntimeError ...
            where = f"connect to the Ray cluster at {address!r}" if address else "start or connect to Ray"
            raise RayClusterError(f"could not {where}: {type(exc).__name__}: {exc}") from exc
    try:
        limits = {job["memory_limit"] for _, job in items if job.get("memory_limit")}
        if limits:
            _check_memory(ray, max(limits))
        remote, preload = _remote(), list(preload)
        queue = list(reversed(items))
        pending: dict[Any, tuple[Any, dict[str, Any]]] = {}
        try:
            while queue or pending:
                while queue and (max_in_flight is None or len(pending) < max_in_flight):
                    case, job = queue.pop()
                    options: dict[str, Any] = {"name": f"sweep:{case.case_id}"}
                    if job.get("memory_limit"):
                        options["memory"] = int(job["memory_limit"])
                    pending[remote.options(**options).remote(run_one, case, job, timeout, preload)] = (case, job)
                done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in done:
                    case, job = pending.pop(ref)
                    try:
                        record = ray.get(ref)
                    except (ray.exceptions.RayTaskError, ray.exceptions.RayError) as exc:
                        on_error(case, job, exc)
                        continue
                    on_record(record)
        finally:
            # Interrupted: a running task gets KeyboardInterrupt (its case process is killed), a queued one
            # never starts; their cases run again on resume.
            for ref in pending:
                ray.cancel(ref)
    finally:
        if started_here:
            ray.shutdown()

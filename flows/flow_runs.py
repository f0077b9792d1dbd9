"""Prefect flow runs that name their process, so that a killed one does not stay Running.

A `layerwise run` killed with SIGKILL leaves its flow run, and the task run it was in, Running in
Prefect's database for good: no handler runs, and the local API server that would notice is gone
with it. Each flow run the CLI starts carries its process as owner tags
(layerwise.tasks.tracking.owner, as `key:value` Prefect tags), and the next command on that host
marks Crashed the runs of an owner that no longer runs, as Prefect marks a flow whose process
crashed under its eyes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from uuid import UUID

from prefect import get_client, tags
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
    TaskRunFilter,
    TaskRunFilterState,
    TaskRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.states import Crashed

from layerwise.tasks.tracking.owner import OWNER_HOST, orphan_reason, owner_gone, owner_tags

_OPEN_STATES = [StateType.RUNNING, StateType.PENDING]


def _as_prefect_tags(owner: dict[str, str]) -> list[str]:
    return [f"{key}:{value}" for key, value in owner.items()]


def _from_prefect_tags(prefect_tags: list[str]) -> dict[str, str]:
    return dict(tag.split(":", 1) for tag in prefect_tags if ":" in tag)


def crash_orphaned_flow_runs() -> list[UUID]:
    """Mark Crashed the Running or Pending flow runs (and their open task runs) whose owner on
    this host is gone; their ids. Runs without owner tags are left alone."""
    host_tag = _as_prefect_tags({OWNER_HOST: owner_tags()[OWNER_HOST]})
    crashed = []
    with get_client(sync_client=True) as client:
        flow_runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=_OPEN_STATES)),
            tags=FlowRunFilterTags(all_=host_tag)))
        for flow_run in flow_runs:
            owner = _from_prefect_tags(flow_run.tags)
            if not owner_gone(owner):
                continue
            state = Crashed(message=orphan_reason(owner))
            task_runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])),
                task_run_filter=TaskRunFilter(state=TaskRunFilterState(
                    type=TaskRunFilterStateType(any_=_OPEN_STATES))))
            for task_run in task_runs:
                client.set_task_run_state(task_run.id, state.model_copy(), force=True)
            client.set_flow_run_state(flow_run.id, state, force=True)
            crashed.append(flow_run.id)
    return crashed


@contextlib.contextmanager
def owned_flow_runs() -> Iterator[None]:
    """Flow runs started inside name this process as their owner; the orphaned ones of a
    process gone before are crashed first."""
    crash_orphaned_flow_runs()
    with tags(*_as_prefect_tags(owner_tags())):
        yield

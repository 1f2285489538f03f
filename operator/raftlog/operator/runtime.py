"""What a runtime provides, and one reconcile pass over it.

A runtime turns members into running nodes (pods and PVCs on Kubernetes, processes and
directories locally) and says what it sees of them. Everything else, the node calls and the
decisions, is shared: `reconcile_pass` observes, decides, saves the status, acts, and folds the
outcome back, so that an operator that dies at any point resumes from what it saved. While a
snapshot install runs (up to the install timeout), its progress is read from the member that
streams it every `INSTALL_PROGRESS_EVERY_S` and saved in its `snapshotInstalls` entry.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from raftlog.node.server.archive import S3ObjectStore
from raftlog.node.server.restore import resolve, take_backup
from raftlog.node.server.restore_target import parse_target
from raftlog.operator.actions import (
    Action,
    CreateMembers,
    DeleteMember,
    Event,
    ExpandVolume,
    InstallSnapshot,
    Outcome,
    PlanRestore,
    RestartMember,
    StopMember,
    TakeBackup,
    Wait,
    describe,
)
from raftlog.operator.cluster_views import MemberObserved, Observed, PodState
from raftlog.operator.controls import NONE, Controls
from raftlog.operator.models import RaftClusterSpec, RaftClusterStatus, SnapshotInstall
from raftlog.operator.nodeapi import NodeApi
from raftlog.operator.reconciler import decide, record_outcome

log = logging.getLogger("raftlog.operator")

INSTALL_PROGRESS_EVERY_S = 2.0
Save = Callable[[RaftClusterStatus], Awaitable[None]]


@dataclass(frozen=True)
class PodInfo:
    pod: PodState
    volume: bool
    url: str
    config_hash: str | None = None
    address: str | None = None  # the pod's, as its runtime reports it (not the cluster DNS)
    volume_size: str | None = None  # what its claim asks for (a Kubernetes quantity)
    volume_capacity: str | None = None  # what the volume has
    # Why the pod cannot start by itself ("ImagePullBackOff", "Unschedulable: ..."), or None.
    stuck: str | None = None


class Runtime(Protocol):
    async def pods(self, spec: RaftClusterSpec, status: RaftClusterStatus) -> dict[str, PodInfo]:
        """Every member's pod (or process) the runtime knows of, by member name."""
        ...

    async def create_members(
        self,
        spec: RaftClusterSpec,
        status: RaftClusterStatus,
        names: tuple[str, ...],
        join: bool,
        launch_hash: str,
    ) -> None: ...

    async def delete_member(self, name: str, delete_volume: bool) -> None: ...

    async def stop_member(self, name: str) -> None:
        """Its pod (process) goes; the next pass decides whether it comes back."""
        ...

    async def expand_volume(self, name: str, size: str) -> None:
        """Its volume's claim asks for `size` (refused with the reason where it cannot grow)."""
        ...

    async def archive_store(self, spec: RaftClusterSpec, url: str) -> S3ObjectStore:
        """The object store at `url` as the members reach it (for restore plans, backups)."""
        ...


@dataclass
class PassResult:
    action: Action | None
    outcome: Outcome | None
    status: RaftClusterStatus
    events: list[Event] = field(default_factory=list)


async def observe(
    runtime: Runtime,
    api: NodeApi,
    spec: RaftClusterSpec,
    status: RaftClusterStatus,
    tell_addresses: bool = True,
) -> Observed:
    pods = await runtime.pods(spec, status)
    running = {name: info.url for name, info in pods.items() if info.pod == "running"}
    api.addresses.known = {
        host: info.address
        for info in pods.values()
        if info.address and (host := urllib.parse.urlsplit(info.url).hostname)
    }
    views = await api.views(running)
    if tell_addresses:  # not to a paused cluster: nothing is done to it
        addresses = {name: info.address for name, info in pods.items() if info.address}
        await api.tell_addresses(running, addresses, views)
    members = {
        name: MemberObserved(
            name,
            info.pod,
            info.volume,
            info.config_hash,
            views.get(name),
            info.volume_size,
            info.volume_capacity,
            info.stuck,
        )
        for name, info in pods.items()
    }
    return Observed(members, {name: info.url for name, info in pods.items()})


async def reconcile_pass(
    name: str,
    spec: RaftClusterSpec,
    status: RaftClusterStatus,
    runtime: Runtime,
    api: NodeApi,
    save: Save,
    generation: int | None = None,
    clock: Callable[[], float] = time.time,
    controls: Controls = NONE,
    progress_every: float = INSTALL_PROGRESS_EVERY_S,
) -> PassResult:
    observed = await observe(runtime, api, spec, status, tell_addresses=not controls.paused)
    plan = decide(name, spec, status, observed, clock(), generation, controls)
    # Saved before acting: a restarted operator finds the member it was about to create.
    await save(plan.status)
    if plan.action is None or isinstance(plan.action, Wait):
        return PassResult(plan.action, None, plan.status, plan.events)
    log.info("%s: %s", name, describe(plan.action))
    doing = act(plan.action, spec, plan.status, runtime, api, observed.urls)
    if isinstance(plan.action, InstallSnapshot):
        progress = InstallProgress.of(plan.action, plan.status, api, observed.urls, save)
        outcome = await (doing if progress is None else progress.around(doing, progress_every))
    else:
        outcome = await doing
    new_status, more = record_outcome(plan.status, plan.action, outcome, clock())
    await save(new_status)
    return PassResult(plan.action, outcome, new_status, plan.events + more)


async def act(
    action: Action,
    spec: RaftClusterSpec,
    status: RaftClusterStatus,
    runtime: Runtime,
    api: NodeApi,
    urls: dict[str, str],
) -> Outcome:
    try:
        match action:
            case CreateMembers(names, join):
                await runtime.create_members(spec, status, names, join, action.launch_hash)
                return Outcome(True)
            case DeleteMember(member, delete_volume):
                await runtime.delete_member(member, delete_volume)
                return Outcome(True)
            case RestartMember(member) | StopMember(member):
                await runtime.stop_member(member)
                return Outcome(True)
            case ExpandVolume(member, size):
                await runtime.expand_volume(member, size)
                return Outcome(True)
            case PlanRestore():
                assert spec.restore is not None
                store = await runtime.archive_store(spec, spec.restore.url)
                target = parse_target(spec.restore.target)
                plan = await resolve(store, store.prefix, spec.partitions, target)
                return Outcome(True, target.describe(), indexes=plan)
            case TakeBackup(name, leaders, resume):
                assert spec.archive is not None
                store = await runtime.archive_store(spec, spec.archive.url)
                at = dict(leaders)

                async def flush(p: int) -> int:
                    if p not in at:
                        raise RuntimeError(f"partition {p} has no leader to archive it")
                    return await api.archive_flush(p, urls[at[p]])

                # Every partition of the spec: one without a leader fails the backup (KeyError
                # in flush) rather than leaving it short.
                backup = await take_backup(
                    store, store.prefix, name, spec.partitions, flush, adopt=resume
                )
                return Outcome(True, backup.created_at, indexes=backup.partitions)
            case _:
                return await api.perform(action, urls)
    except Exception as e:  # a runtime failure is reported, and the next pass decides again
        log.exception("%s failed", describe(action))
        return Outcome(False, f"{type(e).__name__}: {e}")


@dataclass
class InstallProgress:
    """Reports how far a snapshot install is while it runs: every few seconds, the bytes its
    stream reached, read from the `/v1/status` of the member streaming it (the named source,
    or the leader, which streams itself when the source cannot), go into the install's status
    entry and the status is saved. Never a cause of the install's failure: a status that cannot
    be read is skipped and a save that fails ends the reports (both logged at debug)."""

    install: SnapshotInstall  # in `status`, changed in place: the pass's outcome keeps the last
    status: RaftClusterStatus
    api: NodeApi
    sources: list[str]  # URLs to read it from, the named source's first
    save: Save
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    saving: bool = False

    @classmethod
    def of(
        cls,
        action: InstallSnapshot,
        status: RaftClusterStatus,
        api: NodeApi,
        urls: dict[str, str],
        save: Save,
    ) -> InstallProgress | None:
        pending = [i for i in status.snapshot_installs if i.state == "pending"]
        key = (action.target, action.partition)
        install = next((i for i in pending if (i.member, i.partition) == key), None)
        if install is None:
            return None
        names = [action.leader] if action.source == "leader" else [action.source, action.leader]
        sources = [urls[n] for n in dict.fromkeys(names) if n in urls]
        return cls(install, status, api, sources, save)

    async def around(self, doing: Awaitable[Outcome], every: float) -> Outcome:
        """`doing`'s outcome, reporting progress every `every` seconds until it ends."""
        reports = asyncio.create_task(self._report(every))
        try:
            return await doing
        finally:
            self.ended.set()
            if not self.saving:  # a save under way finishes: its resourceVersion is needed
                reports.cancel()
            await asyncio.gather(reports, return_exceptions=True)

    async def _report(self, every: float) -> None:
        i = self.install
        while True:
            try:
                async with asyncio.timeout(every):
                    await self.ended.wait()
                return
            except TimeoutError:
                pass
            try:
                got = await self.api.snapshot_send(self.sources, i.partition, i.member)
            except Exception as e:
                log.debug("progress of the install on %s not read: %s", i.member, e)
                continue
            if got is None or got == (i.bytes_done, i.bytes_total) or self.ended.is_set():
                continue
            i.bytes_done, i.bytes_total = got
            self.saving = True
            try:
                await self.save(self.status)
            except Exception as e:
                log.debug("progress of the install on %s not saved (%s); no more", i.member, e)
                return
            finally:
                self.saving = False

"""Cluster-free parts of the operator and its CLI: spec parsing, status patches, snapshots, views."""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from rich.console import Console

from colocgrpo_operator.cli.watch import render_view
from colocgrpo_operator.controller.reconciler import Reconciler, _status_patch
from colocgrpo_operator.controller.scheduling import PredecessorPending
from colocgrpo_operator.controller.snapshots import (
    all_views,
    batch_job_snapshot,
    has_view,
    job_resource_snapshot,
    newest_view,
    pack,
    pod_snapshot,
    unpack,
)
from colocgrpo_operator.controller.specs import ParsedSpec
from colocgrpo_operator.kopf_glue.owner import adopt, post_event
from colocgrpo_operator.kube.client import KubeApiError

REPO = Path(__file__).resolve().parents[2]
# What the operator's runtime hands every Reconciler: Events and owner references through kopf.
KOPF_OWNER = {"post_event": post_event, "adopt": adopt}


def tiny() -> dict:
    body = yaml.safe_load((REPO / "examples/tiny-cpu.yaml").read_text())
    body["metadata"].update(namespace="ns", uid="uid-1", generation=3)
    return body


def test_parsed_spec_builds_run_facts():
    body = tiny()
    body["spec"]["runPolicy"] = {"maxRestarts": 2, "stallTimeoutSeconds": 60, "suspend": True}
    body["spec"]["scheduling"] = {"queueName": "q"}
    parsed = ParsedSpec(body)
    assert parsed.problems == []
    facts = parsed.facts
    assert (
        facts.nodes,
        facts.gpus_per_node,
        facts.max_restarts,
        facts.suspend,
        facts.queue_name,
        facts.stall_timeout_seconds,
        facts.generation,
    ) == (1, 0, 2, True, "q", 60, 3)
    assert parsed.plan_warning is None  # CPU job: no memory plan


def test_parsed_spec_takes_the_queue_from_kueues_label_and_warns_of_the_field():
    body = tiny()
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "gpu"}
    parsed = ParsedSpec(body)
    assert (parsed.facts.queue_name, parsed.warnings) == ("gpu", [])
    body["metadata"]["labels"] = {}
    body["spec"]["scheduling"] = {"queueName": "q"}
    assert [path for path, _ in ParsedSpec(body).warnings] == ["spec.scheduling.queueName"]


def _runtime_snapshot(spec, generation=1):
    from colocgrpo_operator.controller.record import RuntimeSnapshot

    meta = {"name": "rt", "uid": "u1", "generation": generation}
    return RuntimeSnapshot.of({"kind": "ClusterColocGRPORuntime", "metadata": meta, "spec": spec})


def test_parsed_spec_merges_the_job_with_its_runtime_snapshot():
    body = tiny()
    body["spec"].update(runtimeRef={"name": "rt"}, checkpoint={"resume": "never"})
    runtime = _runtime_snapshot(
        {
            "template": {
                "image": "rt:1",
                "resources": {"nodes": 2},
                "runPolicy": {"maxRestarts": 7, "activeDeadlineSeconds": 900},
            }
        }
    )
    body["spec"]["runPolicy"] = {"maxRestarts": 2}
    parsed = ParsedSpec(body, runtime)
    assert parsed.problems == []
    # The runtime's defaults fill in; the job's own value wins.
    assert (parsed.facts.nodes, parsed.facts.active_deadline_seconds, parsed.facts.max_restarts) == (2, 900, 2)
    assert parsed.job_model(body).spec.image == "rt:1"


def test_parsed_spec_refuses_a_locked_field_the_job_overrides():
    body = tiny()
    body["spec"].update(runtimeRef={"name": "rt"}, image="mine:1")
    parsed = ParsedSpec(body, _runtime_snapshot({"template": {"image": "rt:1"}, "lockedFields": ["image"]}))
    assert parsed.facts is None
    assert [path for path, _ in parsed.problems] == ["spec.image"]
    assert "ClusterColocGRPORuntime rt" in parsed.problems[0][1]


def test_the_record_keeps_the_runtime_snapshot_and_the_status_shows_it():
    from colocgrpo_operator.controller.record import Record
    from colocgrpo_operator.controller.status import invalid_spec_status

    record = Record(restarts=1, runtime=_runtime_snapshot({"template": {"image": "rt:1"}}, generation=3))
    again = Record.decode(record.encode())
    assert again == record
    assert again.runtime.same_object(record.runtime)
    assert not again.runtime.same_object(_runtime_snapshot({}, generation=4))
    status = invalid_spec_status(again, None, [("spec.x", "bad")], datetime.now(UTC), 1)
    assert status["runtime"] == {"kind": "ClusterColocGRPORuntime", "name": "rt", "generation": 3}
    # A job waiting for its runtime is no outcome to take over from the status: it starts once it exists.
    waiting = invalid_spec_status(
        Record(), None, [("spec.runtimeRef", "gone")], datetime.now(UTC), 1, "RuntimeNotFound"
    )
    assert waiting["phase"] == "Pending" and Record.from_status(waiting).outcome is None
    failed = {c["type"]: c for c in waiting["conditions"]}["Failed"]
    assert failed["status"] == "False" and failed["reason"] == "RuntimeNotFound"


def test_parsed_spec_ignores_status_garbage_but_names_spec_fields():
    body = tiny()
    body["status"] = {"phase": 17, "conditions": "nonsense"}
    assert ParsedSpec(body).problems == []
    body["spec"]["rewards"] = [{"function": "not a reward"}]
    problems = ParsedSpec(body).problems
    assert [path for path, _ in problems] == ["spec.rewards[0].function"]


def test_gpu_job_gets_a_plan_condition_input():
    body = tiny()
    body["spec"]["resources"] = {"nodes": 1, "gpusPerNode": 8}
    body["spec"]["model"] = {"name": "Qwen/Qwen2.5-7B-Instruct"}
    warn = ParsedSpec(body).plan_warning
    assert warn is not None and isinstance(warn[0], bool) and warn[1] and warn[2]


@settings(max_examples=200, deadline=None)
@given(
    garbage=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
        max_leaves=15,
    ),
    field=st.sampled_from(
        [
            "spec",
            "model",
            "dataset",
            "resources",
            "rewards",
            "runPolicy",
            "trainerArgs",
            "scheduling",
            "vllm",
            "metadata",
        ]
    ),
)
def test_garbage_specs_are_refused_with_field_paths_never_raised(garbage, field):
    body = tiny()
    if field == "spec":
        body["spec"] = garbage
    elif field == "metadata":
        body["metadata"]["labels"] = garbage
    else:
        body["spec"][field] = garbage
    parsed = ParsedSpec(body)
    assert (not parsed.valid) == bool(parsed.problems)
    for path, message in parsed.problems:
        assert isinstance(path, str) and isinstance(message, str)


def test_parsed_spec_keeps_no_typed_job_and_renders_the_same_children_again():
    # The reconciler keeps no job's typed model (memory at 500 jobs) and parses it again when
    # children must be rendered; the result must not differ.
    body = tiny()
    reconciler = Reconciler(kube=None, default_image="img:1", executor=None, logger=None, **KOPF_OWNER)
    parsed = ParsedSpec(body)
    assert parsed.valid and parsed.facts is not None
    assert not any(isinstance(v, BaseModel) for v in vars(parsed).values())
    first = reconciler._render(parsed, body)
    assert reconciler._render(parsed, body) == first


def test_rendered_children_are_adopted_and_namespaced():
    body = tiny()
    children = Reconciler(kube=None, default_image="img:1", executor=None, logger=None, **KOPF_OWNER)._render(
        ParsedSpec(body), body
    )
    kinds = [c["kind"] for c in children]
    assert kinds.count("Job") == 1
    for child in children:
        assert child["metadata"]["namespace"] == "ns"
        assert child["metadata"]["labels"]["colocgrpo.io/job-name"] == "tiny-cpu"
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner["uid"] == "uid-1" and owner["controller"] is True


class _EventsKube:
    """Answers the FailedCreate lookup with `answer`: a list of Events, or a KubeApiError to raise."""

    def __init__(self, answer):
        self.answer = answer
        self.asked: list[tuple[str, str]] = []

    def failed_create_events(self, namespace, uid):
        self.asked.append((namespace, uid))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_creation_refusal_lookup_reads_the_jobs_events_and_survives_missing_rbac(caplog):
    event = {"reason": "FailedCreate", "message": "exceeded quota: q", "involvedObject": {"uid": "job-1"}}

    async def lookups(kube, times=1):
        with concurrent.futures.ThreadPoolExecutor(1) as executor:
            reconciler = Reconciler(kube, None, executor, logging.getLogger("test-refusal"), **KOPF_OWNER)
            return [await reconciler._creation_refusal(("ns", "demo"), "job-1") for _ in range(times)]

    kube = _EventsKube([event])
    assert asyncio.run(lookups(kube)) == ["exceeded quota: q"] and kube.asked == [("ns", "job-1")]
    # Without `list events` the job only loses its explanation, with one warning for the operator's log.
    with caplog.at_level(logging.WARNING, "test-refusal"):
        assert asyncio.run(lookups(_EventsKube(KubeApiError(403, "Forbidden")), times=3)) == [None] * 3
    assert len([r for r in caplog.records if "cannot list" in r.getMessage()]) == 1
    # Any other error fails the reconcile (retried like every API error).
    with pytest.raises(KubeApiError) as raised:
        asyncio.run(lookups(_EventsKube(KubeApiError(500, "Internal Server Error"))))
    assert raised.value.status == 500


class _ChildCreator:
    """A KubeApi stand-in for the children's creates: each create waits (up to 5 s) until all
    `expected` are in flight at once; `refuse` names a kind answered like a predecessor's child."""

    def __init__(self, expected: int, refuse: str | None = None):
        self.barrier = threading.Barrier(expected, timeout=5)
        self.refuse = refuse
        self.created: list[str] = []

    def create(self, child: dict) -> bool:
        self.barrier.wait()  # BrokenBarrierError if the creates ran one after another
        self.created.append(child["kind"])
        return child["kind"] != self.refuse  # False: it exists (409): the reconciler applies instead

    def apply(self, child: dict) -> None:
        raise KubeApiError(422, "Invalid", '{"message": "Only one reference can have Controller set to true"}')

    def get(self, kind: str, namespace: str, name: str) -> dict:
        # Held by some other owner (not a job of the same name): waited for, never deleted.
        owner = {"kind": "ConfigMap", "name": "holder", "uid": "holder-uid", "controller": True}
        return {"kind": kind, "metadata": {"name": name, "namespace": namespace, "ownerReferences": [owner]}}


def _apply_children(kube: _ChildCreator, nodes: int = 1) -> None:
    body = tiny()
    body["spec"]["resources"]["nodes"] = nodes
    body["spec"]["checkpoint"] = {"resume": "never"}  # several pods on their own emptyDirs
    with concurrent.futures.ThreadPoolExecutor(8) as executor:
        reconciler = Reconciler(
            kube=kube, default_image="img:1", executor=executor, logger=logging.getLogger("t"), **KOPF_OWNER
        )
        asyncio.run(reconciler._apply_children(reconciler._render(ParsedSpec(body), body), new_job=True))


@pytest.mark.parametrize(
    ("nodes", "kinds"),
    [
        (1, ["ConfigMap", "Role", "RoleBinding", "ServiceAccount"]),  # every rank in one pod: no Service
        (2, ["ConfigMap", "Role", "RoleBinding", "Service", "ServiceAccount"]),
    ],
)
def test_a_new_jobs_children_are_created_at_once_and_never_its_job(nodes, kinds):
    kube = _ChildCreator(expected=len(kinds))
    _apply_children(kube, nodes)
    assert sorted(kube.created) == kinds


def test_a_child_still_a_predecessors_waits_but_the_others_are_created():
    kube = _ChildCreator(expected=5, refuse="ServiceAccount")
    with pytest.raises(PredecessorPending, match="ServiceAccount"):
        _apply_children(kube, nodes=2)
    assert len(kube.created) == 5


def test_status_patch_nulls_removed_keys_and_never_touches_progress():
    current = {"phase": "Running", "rank0Pod": "p-0", "progress": {"step": 3}}
    desired = {"phase": "Restarting"}
    assert _status_patch(current, desired) == {"phase": "Restarting", "rank0Pod": None}
    assert "progress" not in _status_patch(current, dict(desired, progress={"step": 0}))


def test_snapshots_keep_what_status_needs_and_detach():
    pod = {
        "metadata": {
            "name": "p",
            "uid": "u",
            "labels": {"batch.kubernetes.io/job-completion-index": "0", "x": "y"},
            "ownerReferences": [{"uid": "j", "kind": "Job", "name": "demo", "controller": True}],
            "managedFields": [{"huge": True}],
        },
        "spec": {"nodeName": "n", "containers": [{"name": "trainer"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "trainer", "state": {"running": {}}}]},
    }
    snap = pod_snapshot(pod)
    assert "managedFields" not in snap["metadata"] and "containers" not in snap["spec"]
    assert snap["metadata"]["labels"] == {"batch.kubernetes.io/job-completion-index": "0"}
    pod["status"]["phase"] = "Failed"
    assert snap["status"]["phase"] == "Running"
    job = batch_job_snapshot(
        {
            "metadata": {"name": "demo", "uid": "j"},
            "spec": {"suspend": True, "template": {}},
            "status": {"conditions": [{"type": "Complete", "status": "True"}]},
        }
    )
    assert job["spec"] == {"suspend": True} and job["status"]["conditions"][0]["type"] == "Complete"
    body = tiny()
    body["metadata"]["annotations"] = {
        "colocgrpo.io/last-handled-configuration": "{...}",
        "colocgrpo.io/gpu-memory-gib": "80",
        "team": "a",
    }
    cr = job_resource_snapshot(copy.deepcopy(body))
    assert cr["metadata"]["annotations"] == {"colocgrpo.io/gpu-memory-gib": "80", "team": "a"}


def test_indices_keep_views_packed_and_hand_them_out_decoded():
    body = tiny()
    body["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "message": "ünïcode"}]}
    view = job_resource_snapshot(body)
    packed = pack(view)
    assert isinstance(packed, str) and '", "' not in packed and '": ' not in packed  # compact separators
    index = {("ns", "a"): [packed], ("ns", "gone"): []}
    assert newest_view(index, ("ns", "a")) == view and newest_view(index, ("ns", "gone")) is None
    assert has_view(index, ("ns", "a")) and not has_view(index, ("ns", "gone")) and not has_view(index, ("x", "y"))
    pods = [pod_snapshot({"metadata": {"name": f"p{i}"}, "status": {"phase": "Running"}}) for i in range(2)]
    assert all_views({("ns", "a"): [pack(p) for p in pods]}, ("ns", "a")) == pods
    assert all_views({}, ("ns", "a")) == []
    decoded = newest_view(index, ("ns", "a"))
    decoded["status"]["phase"] = "Failed"  # every read is a fresh copy: nothing mutates the index
    assert newest_view(index, ("ns", "a"))["status"]["phase"] == "Running"


def test_watch_view_shows_phase_step_reward_and_conditions():
    obj = {
        "metadata": {"name": "demo", "namespace": "ns"},
        "status": {
            "phase": "Running",
            "message": "2/2 workers running",
            "restarts": 1,
            "progress": {"step": 5, "maxSteps": 10, "metrics": {"reward": 0.625}},
            "conditions": [{"type": "Stalled", "status": "True", "reason": "Stalled", "message": "no progress"}],
        },
    }
    console = Console(record=True, width=120)
    console.print(render_view(obj))
    text = console.export_text()
    for expected in ("ns/demo", "Running", "step 5/10", "reward 0.625", "Stalled", "restarts 1"):
        assert expected in text, (expected, text)


def test_ttl_deadline_derives_from_the_recorded_completion_time():
    from datetime import datetime

    from colocgrpo_operator.controller.housekeeping import ttl_deadline
    from colocgrpo_operator.controller.record import Outcome, Record

    cr = {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 30}}, "status": {"phase": "Running"}}
    outcome = Outcome("Failed", "DataError", "bad data", "DataError", "bad data")
    done = Record(completion_time="2026-01-01T00:00:00Z", outcome=outcome)
    assert ttl_deadline(cr, done, None) == datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
    assert ttl_deadline(cr, Record(completion_time="2026-01-01T00:00:00Z"), None) is None  # not finished
    assert ttl_deadline(dict(cr, spec={}), done, None) is None
    assert ttl_deadline(cr, Record(outcome=outcome), None) is None  # no completion time
    zero = {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 0}}}
    assert ttl_deadline(zero, done, None) is not None
    # A job that leaves the TTL to its runtime gets the runtime's, as its last gang was merged with it.
    import dataclasses

    runtime = _runtime_snapshot({"template": {"runPolicy": {"ttlSecondsAfterFinished": 60}}})
    merged = dataclasses.replace(done, runtime=runtime)
    assert ttl_deadline(dict(cr, spec={}), merged, None) == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    assert ttl_deadline(cr, merged, None) == datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)  # the job's own wins


def test_planner_reads_the_gpu_memory_annotation_the_operator_keeps():
    # The operator's index view must keep exactly the annotation the plan reads.
    from colocgrpo_operator.api import GPU_MEMORY_ANNOTATION
    from colocgrpo_operator.controller.snapshots import job_resource_snapshot
    from colocgrpo_operator.render import plan_job

    body = yaml.safe_load((REPO / "examples" / "seed-qwen14b-tp4.yaml").read_text())
    body["metadata"]["annotations"] = {GPU_MEMORY_ANNOTATION: "80"}
    assert plan_job(job_resource_snapshot(body)).gpu_memory_gib == 80.0


def test_namespace_rescan_adds_what_kopf_missed_with_kopfs_own_rules():
    import asyncio
    import logging

    from colocgrpo_operator.kopf_glue.namespaces import NamespaceRescan, new_insights

    def namespace(name: str, terminating: bool = False, conditions: bool = True) -> dict:
        body: dict = {"metadata": {"name": name}, "status": {"phase": "Active"}}
        if terminating:
            body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            body["status"] = {"phase": "Terminating"}
            if conditions:  # the namespace controller has started on it
                body["status"]["conditions"] = [{"type": "X", "status": "False"}]
        return body

    async def scenario() -> tuple[set[str], set[str], set]:
        insights = new_insights()
        insights.namespaces.update({"team-a", "team-gone"})

        async def listing() -> list[dict]:
            return [
                namespace("team-a"),
                namespace("team-b"),
                namespace("other"),
                namespace("team-gone", True),
                namespace("team-just-deleted", True, conditions=False),  # kopf's rules would serve it
            ]

        rescan = NamespaceRescan(insights, ["team-*"], listing, 1.0, logging.getLogger("test"))
        first = await rescan.revise(await listing())
        again = await rescan.revise(await listing())
        return first, again, set(insights.namespaces)

    added, added_again, served = asyncio.run(scenario())
    assert added == {"team-b"}  # created while kopf was not looking
    assert added_again == set()
    # "other" does not match; a terminating namespace is let go, as kopf does; one deleted a moment ago is not taken up
    assert served == {"team-a", "team-b"}


class _WritesKube:
    """Records the reconciler's writes in order; every write of the job answers with the object it
    produced, at a new resourceVersion, as the API server does."""

    def __init__(self):
        self.calls: list[str] = []
        self.version = 100
        self.job = tiny()
        self.job["metadata"]["resourceVersion"] = "100"
        self.lock = threading.Lock()

    def _bump(self) -> dict:
        self.version += 1
        self.job["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.job)

    def create(self, obj):
        with self.lock:
            self.calls.append(f"create {obj['kind']}")
        return True

    def create_returning(self, obj):
        with self.lock:
            self.calls.append(f"create {obj['kind']}")
            self.batch_job = dict(obj, status={})
            return self.batch_job

    def list_objects(self, kind, namespace, selector=None):
        return {"items": []}  # no predecessor left anything

    def patch_annotations(self, namespace, name, uid, annotations):
        with self.lock:
            self.calls.append("record")
            self.job["metadata"].setdefault("annotations", {}).update(annotations)
            return self._bump()

    def patch_status(self, namespace, name, uid, patch, whole=False):
        with self.lock:
            self.calls.append("status")
            status = {} if whole else dict(self.job.get("status") or {})
            status.update(patch)
            self.job["status"] = {k: v for k, v in status.items() if v is not None}
            return self._bump()


def test_record_extras_go_with_a_new_jobs_first_record_only():
    from colocgrpo_operator.api.naming import RECORD_ANNOTATION
    from colocgrpo_operator.controller.record import RecordExtras

    kube = _WritesKube()
    key = ("ns", "tiny-cpu")
    created = copy.deepcopy(kube.job)
    extras = RecordExtras({"colocgrpo.io/last-handled-configuration": "{}\n", "colocgrpo.io/kopf-managed": "yes"})

    async def run() -> None:
        with concurrent.futures.ThreadPoolExecutor(4) as executor:
            reconciler = Reconciler(kube, "img:1", executor, logging.getLogger("test-extras"), **KOPF_OWNER)
            await reconciler.reconcile(
                key,
                lambda: (created, None, [], []),
                trigger="create",
                ensure_children=True,
                fresh_cr=created,
                record_extras=extras,
            )
            assert extras.written and kube.calls.count("record") == 1
            assert kube.calls.index("record") < kube.calls.index("create Job")
            annotations = kube.job["metadata"]["annotations"]
            assert annotations["colocgrpo.io/last-handled-configuration"] == "{}\n"
            assert annotations["colocgrpo.io/kopf-managed"] == "yes" and RECORD_ANNOTATION in annotations
            # A job that has its record already writes none, and so no extras either.
            later = RecordExtras({"colocgrpo.io/last-handled-configuration": "changed"})
            await reconciler.reconcile(
                key,
                lambda: (copy.deepcopy(kube.job), kube.batch_job, [], []),
                trigger="create",
                record_extras=later,
            )
            assert (
                not later.written
                and kube.job["metadata"]["annotations"]["colocgrpo.io/last-handled-configuration"] == "{}\n"
            )

    asyncio.run(run())


class _BlockedJobCreateKube(_WritesKube):
    """Creating the batch Job waits until `release` is set."""

    def __init__(self):
        super().__init__()
        self.creating = threading.Event()
        self.release = threading.Event()

    def create_returning(self, obj):
        self.creating.set()
        assert self.release.wait(30)
        return super().create_returning(obj)


@pytest.mark.parametrize("cap", [None, 0.05])
def test_child_reconciles_wait_for_the_jobs_being_created(monkeypatch, cap):
    """While a job's children are being applied, another job's child-event reconcile waits (and
    the job's further events coalesce into it) until the creation is done, or at most the cap."""
    from colocgrpo_operator.controller import scheduling

    if cap is not None:
        monkeypatch.setattr(scheduling, "DEFER_WHILE_APPLYING_SECONDS", cap)
    kube = _BlockedJobCreateKube()
    created = copy.deepcopy(kube.job)
    other = ("ns", "other")
    reads: list[str] = []

    def read_other():
        reads.append("other")
        return None, None, [], []

    async def run() -> None:
        with concurrent.futures.ThreadPoolExecutor(4) as executor:
            reconciler = Reconciler(kube, "img:1", executor, logging.getLogger("test-defer"), **KOPF_OWNER)
            creating = asyncio.create_task(
                reconciler.reconcile(
                    ("ns", "tiny-cpu"), lambda: (created, None, [], []), trigger="create", ensure_children=True
                )
            )
            while not kube.creating.is_set():
                await asyncio.sleep(0.01)
            for _ in range(3):
                reconciler.reconcile_soon(other, read_other, trigger="child")  # coalesced into one
            if cap is None:
                for _ in range(20):
                    await asyncio.sleep(0)
                assert reads == []  # waiting for the Job's creation
                kube.release.set()
                await creating
            else:
                while not reads:  # the cap passed while the Job is still being created
                    await asyncio.sleep(0.01)
                assert not creating.done()
                kube.release.set()
                await creating
            while reconciler.schedule.busy:
                await asyncio.sleep(0.01)
            assert reads == ["other"]

    asyncio.run(run())


def test_a_new_jobs_record_precedes_its_job_and_its_own_writes_never_pass_for_drift():
    kube = _WritesKube()
    key = ("ns", "tiny-cpu")
    created = copy.deepcopy(kube.job)  # what the create event showed: no status, no record

    async def run() -> None:
        with concurrent.futures.ThreadPoolExecutor(4) as executor:
            reconciler = Reconciler(kube, "img:1", executor, logging.getLogger("test-writes"), **KOPF_OWNER)
            await reconciler.reconcile(
                key, lambda: (created, None, [], []), trigger="create", ensure_children=True, fresh_cr=created
            )
            assert kube.calls.index("record") < kube.calls.index("create Job")
            assert kube.calls[-1] == "status"
            after_record = dict(kube.job, status={})  # the record's own patch, as a late watch event shows it
            after_record["metadata"] = dict(kube.job["metadata"], resourceVersion="101")
            assert after_record["metadata"]["annotations"]
            # The event of the record's patch arrives after the first status write: it is the
            # operator's own object, not someone emptying the status; a reconcile from it writes nothing.
            assert not reconciler.ledger.status_drifted(key, after_record)
            writes = len(kube.calls)
            await reconciler.reconcile(key, lambda: (after_record, kube.batch_job, [], []), trigger="status")
            assert kube.calls[writes:] == []
            # The same status at a version the operator did not produce is someone else's write,
            # repaired at once.
            emptied = dict(after_record, metadata=dict(after_record["metadata"], resourceVersion="999"))
            assert reconciler.ledger.status_drifted(key, emptied)
            await reconciler.reconcile(key, lambda: (emptied, kube.batch_job, [], []), trigger="status")
            assert kube.calls[writes:] == ["status"]

    asyncio.run(run())


def test_diffbase_essence_is_kopfs_without_copying_metadata_and_status():
    import kopf

    from colocgrpo_operator.kopf_glue.startup import BoundedDiffBaseStorage

    body = tiny()
    body["metadata"].update(
        labels={"team": "a"},
        annotations={
            "note": "kept",
            "colocgrpo.io/last-handled-configuration": "{}",
            "kopf.zalando.org/last-handled-configuration": "{}",
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
        },
        managedFields=[{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:model": {}}}}],
        resourceVersion="7",
    )
    body["status"] = {"phase": "Running", "conditions": [{"type": "Running", "status": "True"}]}
    ours = BoundedDiffBaseStorage(prefix="colocgrpo.io", key="last-handled-configuration")
    kopfs = kopf.AnnotationsDiffBaseStorage(prefix="colocgrpo.io", key="last-handled-configuration")
    for sample in (body, {k: v for k, v in body.items() if k != "metadata"}, {"kind": "Pod"}):
        essence = ours.build(body=kopf.Body(copy.deepcopy(sample)))
        assert essence == kopfs.build(body=kopf.Body(copy.deepcopy(sample)))
    essence = ours.build(body=kopf.Body(body))
    assert essence["spec"] == body["spec"] and essence["spec"] is not body["spec"]  # a copy, as kopf's
    assert essence["metadata"] == {"labels": {"team": "a"}, "annotations": {"note": "kept"}}


def test_diffbase_a_handler_wrote_is_left_out_of_kopfs_next_patch():
    import kopf

    from colocgrpo_operator.kopf_glue.startup import BoundedDiffBaseStorage, ProgressStorage

    body = tiny()
    body["metadata"]["uid"] = "u1"
    storage = BoundedDiffBaseStorage(prefix="colocgrpo.io", key="last-handled-configuration")
    essence = storage.build(body=kopf.Body(copy.deepcopy(body)))
    kopfs = kopf.Patch()
    kopf.AnnotationsDiffBaseStorage(prefix="colocgrpo.io", key="last-handled-configuration").store(
        body=kopf.Body(body), patch=kopfs, essence=essence
    )
    annotations = storage.annotations(body=kopf.Body(body), essence=essence)
    assert annotations == dict(kopfs.metadata.annotations)  # the diff-base and the marker, as kopf's
    assert set(annotations) == {"colocgrpo.io/last-handled-configuration", "colocgrpo.io/kopf-managed"}

    storage.written(body=kopf.Body(body), annotations=annotations)
    patch = kopf.Patch()
    storage.store(body=kopf.Body(body), patch=patch, essence=essence)
    assert not patch  # nothing left for kopf to write
    patch = kopf.Patch()
    storage.store(body=kopf.Body(body), patch=patch, essence=essence)
    assert dict(patch.metadata.annotations) == annotations  # only once: later stores are kopf's own

    changed = dict(essence, spec=dict(essence["spec"], model="other"))
    storage.written(body=kopf.Body(body), annotations=annotations)
    patch = kopf.Patch()
    storage.store(body=kopf.Body(body), patch=patch, essence=changed)
    assert dict(patch.metadata.annotations) == {
        "colocgrpo.io/last-handled-configuration": storage.annotations(body=kopf.Body(body), essence=changed)[
            "colocgrpo.io/last-handled-configuration"
        ]
    }  # another essence than the one written: kopf stores it

    huge = dict(essence, spec={"trainerArgs": {"x": "y" * 200_000}})
    assert storage.annotations(body=kopf.Body(body), essence=huge) == {}

    # kopf's progress storage adds the marker whenever it stores a handler's progress: not once a
    # handler wrote it (until kopf's store of the diff-base).
    progress = ProgressStorage(prefix="colocgrpo.io", diffbase=storage)
    storage.written(body=kopf.Body(body), annotations=annotations)
    patch = kopf.Patch()
    progress.store(key="reconcile_job", record={"success": True}, body=kopf.Body(body), patch=patch)
    assert set(patch.metadata.annotations) == {"colocgrpo.io/reconcile_job"}
    progress.purge(key="reconcile_job", body=kopf.Body(body), patch=patch)
    storage.store(body=kopf.Body(body), patch=patch, essence=essence)
    assert not patch
    patch = kopf.Patch()
    progress.store(key="reconcile_job", record={"success": True}, body=kopf.Body(body), patch=patch)
    assert set(patch.metadata.annotations) == {"colocgrpo.io/reconcile_job", "colocgrpo.io/kopf-managed"}


def test_indexers_drop_the_events_managed_fields_and_nothing_else():
    import kopf

    from colocgrpo_operator.kopf_glue.handlers import jobs_by_name

    raw = tiny()
    raw["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    expected = copy.deepcopy(raw)
    expected["metadata"]["managedFields"] = []
    indexed = asyncio.run(jobs_by_name(namespace="ns", name="tiny-cpu", body=kopf.Body(raw)))
    assert raw == expected  # kopf's own event object, as every later handler of the event sees it
    assert indexed == {("ns", "tiny-cpu"): pack(job_resource_snapshot(expected))}


def test_transient_api_failures_are_retried_with_backoff_and_one_warning_line(monkeypatch, caplog):
    import http.client

    from colocgrpo_operator.controller import scheduling

    monkeypatch.setattr(scheduling, "TRANSIENT_RETRY_SECONDS", 0.01)
    failures = [http.client.RemoteDisconnected("Remote end closed connection without response"), KubeApiError(503, "x")]
    calls: list[scheduling.Request] = []

    async def reconcile_locked(key, inputs, request) -> None:
        calls.append(request)
        if failures:
            raise failures.pop(0)

    async def run() -> None:
        schedule = scheduling.ReconcileScheduler(reconcile_locked, logging.getLogger("test-transient"))
        request = scheduling.Request("create", ensure_children=True)
        await schedule.reconcile(("ns", "j"), lambda: (None, None, [], []), request)  # no exception for kopf
        while schedule.busy:
            await asyncio.sleep(0.01)
        # A non-transient error is the caller's, as before.
        with pytest.raises(KubeApiError):
            failures.append(KubeApiError(422, "Invalid"))
            await schedule.reconcile(("ns", "j"), lambda: (None, None, [], []), request)

    with caplog.at_level(logging.WARNING, "test-transient"):
        asyncio.run(run())
    assert [c.trigger for c in calls] == ["create", "retry", "retry", "create"]
    assert all(c.ensure_children for c in calls)  # a retry of a create applies the children too
    warnings = [r for r in caplog.records if r.name == "test-transient"]
    assert len(warnings) == 2 and all(r.levelno == logging.WARNING and not r.exc_info for r in warnings)
    assert "RemoteDisconnected" in warnings[0].getMessage() and "503" in warnings[1].getMessage()


def test_kopfs_lines_about_transient_failures_become_one_line_warnings():
    import aiohttp

    from colocgrpo_operator.kopf_glue.transient_logs import TransientApiLogFilter

    def record(message: str, error: BaseException | None = None, name: str = "kopf.objects") -> logging.LogRecord:
        exc_info = (type(error), error, None) if error is not None else None
        return logging.LogRecord(name, logging.ERROR, __file__, 1, message, None, exc_info)

    retry = record("Request attempt #1/9 failed; will retry: PATCH https://x -> ClientOSError(104)")
    gave_up = record("Throttling for 1 seconds due to an unexpected error", aiohttp.ServerDisconnectedError())
    bug = record("Handler 'reconcile_job' failed with an exception", ValueError("a bug"))
    ours = record("Request attempt #1/9 failed; will retry", name="colocgrpo.operator")
    for item in (retry, gave_up, bug, ours):
        assert TransientApiLogFilter().filter(item)
    assert retry.levelno == gave_up.levelno == logging.WARNING and gave_up.exc_info is None
    assert "ServerDisconnectedError" in gave_up.getMessage() and "\n" not in gave_up.getMessage()
    assert bug.levelno == logging.ERROR and bug.exc_info is not None  # what a human must look at stays ERROR
    assert ours.levelno == logging.ERROR  # only kopf's lines are rewritten


def test_kopf_warning_about_absent_kueue_is_one_info_line(caplog) -> None:
    from kopf._cogs.structs.references import Selector

    from colocgrpo_operator.kopf_glue.kueue_watch import KUEUE_WORKLOADS, AbsentKueueFilter, names_only_kueue

    # kopf's own text (kopf._core.reactor.observation._disable_mismatched_selectors), its selectors' own repr.
    prefix = "Unresolved resources cannot be served (try creating their CRDs): "
    kueue, ours = Selector(*KUEUE_WORKLOADS), Selector("colocgrpo.io", "v1alpha1", "colocgrpojobs")
    assert names_only_kueue(f"{prefix}{kueue}")
    assert not names_only_kueue(f"{prefix}{kueue}, {ours}") and not names_only_kueue(f"{prefix}{ours}")
    assert not names_only_kueue(f"Ambiguous resources will not be served: {kueue}")

    kopf_logger = logging.getLogger("kopf._core.reactor.observation")
    told = logging.getLogger("colocgrpo.test.kueue")
    only_kueue = AbsentKueueFilter(told)

    def record(text: str) -> logging.LogRecord:
        return kopf_logger.makeRecord(kopf_logger.name, logging.WARNING, __file__, 1, text, None, None)

    with caplog.at_level(logging.INFO, logger="colocgrpo.test.kueue"):
        kopf_logger.setLevel(logging.INFO)
        try:
            first, again, other = record(f"{prefix}{kueue}"), record(f"{prefix}{kueue}"), record(f"{prefix}{ours}")
            assert only_kueue.filter(first) is False and only_kueue.filter(again) is False  # dropped at INFO
            assert only_kueue.filter(other) is True and other.levelno == logging.WARNING  # a real problem stays
            kopf_logger.setLevel(logging.DEBUG)
            kept = record(f"{prefix}{kueue}")
            assert only_kueue.filter(kept) is True and kept.levelno == logging.DEBUG
        finally:
            kopf_logger.setLevel(logging.NOTSET)
    assert [r.getMessage() for r in caplog.records if r.name == told.name] == [
        "Kueue's Workload API is not installed: jobs run without Kueue, and Kueue's Workloads are watched "
        "once its CRDs appear"
    ]


def test_kopf_lines_about_events_a_terminating_namespace_refuses_are_debug() -> None:
    from colocgrpo_operator.kopf_glue.event_refusals import TerminatingNamespaceEventFilter

    poster = logging.getLogger("kopf._core.engines.posting")
    url = "POST https://127.0.0.1:6443/api/v1/namespaces/team-a/events"
    refusal = (
        'APIForbiddenError(\'events "colocgrpo-" is forbidden: unable to create new content in namespace team-a '
        "because it is being terminated', {'code': 403})"
    )
    # kopf's lines for one refused Event (kopf._cogs.clients.api.request, kopf._cogs.clients.events.post_event).
    lines = [
        (logging.WARNING, f"Request attempt #1/9 failed; will retry: {url} -> {refusal}"),
        (logging.ERROR, f"Request attempt #9/9 failed; escalating: {url} -> {refusal}"),
        (logging.WARNING, f"Failed to post an event. Ignoring and continuing. Code: 403. Message: {refusal}."),
    ]
    other = (logging.WARNING, f"Failed to post an event. Ignoring and continuing. Code: 403. Message: {url} forbidden.")
    quiet = TerminatingNamespaceEventFilter()
    poster.setLevel(logging.INFO)
    try:
        records = [poster.makeRecord(poster.name, level, __file__, 1, text, None, None) for level, text in lines]
        assert [quiet.filter(r) for r in records] == [False, False, False]  # dropped where DEBUG is not logged
        kept = poster.makeRecord(poster.name, other[0], __file__, 1, other[1], None, None)
        assert quiet.filter(kept) is True and kept.levelno == logging.WARNING  # an RBAC gap, say, stays a warning
        poster.setLevel(logging.DEBUG)
        record = poster.makeRecord(poster.name, lines[1][0], __file__, 1, lines[1][1], None, None)
        assert quiet.filter(record) is True and record.levelname == "DEBUG"
    finally:
        poster.setLevel(logging.NOTSET)


def test_the_newest_of_two_views_under_one_key_is_the_live_one():
    """A deleted job kopf never saw go sits beside its successor of the same name: the successor,
    created after the predecessor's last change, has the higher resourceVersion."""
    old, new = tiny(), tiny()
    old["metadata"].update(uid="old", resourceVersion="900")
    new["metadata"].update(uid="new", resourceVersion="1000")  # numerically higher, lexically lower
    index = {("ns", "a"): [pack(job_resource_snapshot(old)), pack(job_resource_snapshot(new))]}
    assert newest_view(index, ("ns", "a"))["metadata"]["uid"] == "new"
    index = {("ns", "a"): [pack(job_resource_snapshot(new)), pack(job_resource_snapshot(old))]}
    assert newest_view(index, ("ns", "a"))["metadata"]["uid"] == "new"


def test_the_index_audit_drops_only_entries_a_newer_listing_lacks():
    from kopf._core.engines.indexing import Index as KopfIndex

    from colocgrpo_operator.kopf_glue.index_audit import AuditedIndex, IndexAudit

    def pod(name: str, uid: str, version: str, namespace: str = "ns") -> dict:
        return {"metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": version}}

    index: KopfIndex = KopfIndex()
    entries = [
        pod("gone", "u-gone", "90"),  # deleted in the gap: older than the listing, not in it
        pod("live", "u-live", "95"),  # in the listing
        pod("young", "u-young", "120"),  # newer than the listing: perhaps created after it
        pod("other", "u-other", "90", namespace="ns2"),  # another namespace, listed on its own
    ]
    for body in entries:
        meta = body["metadata"]
        index._replace((meta["namespace"], meta["name"], meta["uid"]), {(meta["namespace"], "job"): pack(body)})
    listings = {
        "ns": {"metadata": {"resourceVersion": "100"}, "items": [pod("live", "u-live", "95")]},
        "ns2": {"metadata": {"resourceVersion": "100"}, "items": [pod("other", "u-other", "90", "ns2")]},
    }
    asked, reconciled = [], []

    async def list_objects(kind, namespace, selector):
        asked.append((kind, namespace, selector))
        return listings[namespace]

    audit = IndexAudit(
        [AuditedIndex("Pod", index, "colocgrpo.io/job-name")], list_objects, 1.0, reconciled.append, logging.getLogger()
    )
    dropped = asyncio.run(audit.audit_once())
    assert [(d.kind, d.job, d.name, d.uid) for d in dropped] == [("Pod", ("ns", "job"), "gone", "u-gone")]
    assert sorted(unpack(p)["metadata"]["name"] for p in index[("ns", "job")]) == ["live", "young"]
    assert asked == [("Pod", "ns", "colocgrpo.io/job-name"), ("Pod", "ns2", "colocgrpo.io/job-name")]
    assert reconciled == [("ns", "job")]
    assert asyncio.run(audit.audit_once()) == [] and reconciled == [("ns", "job")]


def test_the_operators_loop_is_finished_as_asyncio_run_finishes_one():
    """kopf runs the loop it is given and leaves it: the daemon cancels the tasks left, lets an
    unfinished watch stream's generator clean up, and closes the loop."""
    from colocgrpo_operator.daemon import _close_loop

    cleaned = []

    async def stream():
        try:
            while True:
                yield 1
        finally:
            await asyncio.sleep(0)  # a cleanup that needs the loop, like closing an HTTP response
            cleaned.append(True)

    generator = stream()

    async def consume_one() -> None:  # on the loop, so the loop knows the generator
        await generator.__anext__()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(consume_one())  # half-consumed, as a watch is at shutdown
    left = loop.create_task(asyncio.sleep(3600))
    _close_loop(loop)
    assert left.cancelled() and cleaned == [True] and loop.is_closed()


class _SweptKube:
    """Lists one leftover of each kind asked for, in three ownerships; records lists and deletes."""

    def __init__(self):
        self.listed: list[str] = []
        self.deleted: list[tuple[str, str]] = []

    def list_objects(self, kind, namespace, selector=None):
        self.listed.append(kind)

        def child(name: str, owner_name: str, owner_uid: str) -> dict:
            owner = {"kind": "ColocGRPOJob", "name": owner_name, "uid": owner_uid}
            return {"metadata": {"name": name, "uid": f"{name}-uid", "ownerReferences": [owner]}}

        return {
            "items": [
                child("predecessors", "demo", "old-uid"),  # a deleted job of the same name: goes
                child("mine", "demo", "current-uid"),  # this job's own
                child("someone-elses", "other", "other-uid"),  # another job's
            ]
        }

    def delete(self, kind, namespace, name, *, propagation="Background", uid=None):
        self.deleted.append((kind, name))
        return True


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_new_job_sweeps_only_kinds_it_does_not_render_and_only_a_predecessors(nodes):
    body = tiny()
    body["metadata"].update(name="demo", namespace="ns", uid="current-uid")
    body["spec"]["resources"]["nodes"] = nodes
    body["spec"]["checkpoint"] = {"resume": "never"}
    kube = _SweptKube()
    with concurrent.futures.ThreadPoolExecutor(4) as executor:
        reconciler = Reconciler(
            kube=kube, default_image="img:1", executor=executor, logger=logging.getLogger("t"), **KOPF_OWNER
        )
        rendered = {c["kind"] for c in reconciler._render(ParsedSpec(body), body)}
        asyncio.run(reconciler._sweep_predecessors(("ns", "demo"), body, rendered))
    # A multi-node job renders a Service of its own name: a predecessor's is met on the apply.
    assert kube.listed == ([] if nodes > 1 else ["Service"])
    assert kube.deleted == ([] if nodes > 1 else [("Service", "predecessors")])

"""The gang: ConfigMap with the trainer's files, headless Service (multi-node jobs), Indexed batch/v1 Job.

Pure functions: a validated ColocGRPOJob in, Kubernetes object dicts out.
"""

from __future__ import annotations

from typing import Any

from colocgrpo_operator import __version__
from colocgrpo_operator.api.model import ColocGRPOJob
from colocgrpo_operator.api.naming import (
    ACCELERATE_CONFIG_KEY,
    COMPLETION_INDEX_KEY,
    CONFIG_MOUNT_DIR,
    DEEPSPEED_CONFIG_KEY,
    GPU_RESOURCE,
    GRPO_CONFIG_KEY,
    JOB_NAME_LABEL,
    KUEUE_PRIORITY_CLASS_LABEL,
    KUEUE_QUEUE_LABEL,
    OPERATOR_NAME,
    RENDEZVOUS_PORT,
    REWARD_MODULES_DIR,
    SHM_DIR,
    SUSPEND_REQUESTED_ANNOTATION,
    TMP_DIR,
    TRAINER_APP_NAME,
    batch_job_name,
    config_map_name,
    rank0_address,
    service_name,
    trainer_account_name,
)
from colocgrpo_operator.api.queueing import job_priority_class, job_queue
from colocgrpo_operator.render.launch_config import render_accelerate_yaml, render_deepspeed_json
from colocgrpo_operator.render.trainer_config import render_trainer_config

DEFAULT_TRAINER_IMAGE = f"colocgrpo/trainer:{__version__}"
TRAINER_CONTAINER = "trainer"
TERMINATION_LOG = "/dev/termination-log"
# ZeRO-3 gathers and writes a full checkpoint on SIGTERM (suspend, preemption); give it time.
TERMINATION_GRACE_SECONDS = 300
# Rank 0's address when every rank is in one pod.
LOOPBACK_ADDRESS = "127.0.0.1"


def child_labels(job: ColocGRPOJob) -> dict[str, str]:
    """Labels on every child object and pod."""
    return {
        JOB_NAME_LABEL: job.name,
        "app.kubernetes.io/name": TRAINER_APP_NAME,
        "app.kubernetes.io/instance": job.name,
        "app.kubernetes.io/managed-by": OPERATOR_NAME,
    }


def object_meta(job: ColocGRPOJob, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": job.namespace, "labels": child_labels(job), **extra}


def render_config_map(job: ColocGRPOJob) -> dict[str, Any]:
    # Exactly these three keys; secrets never go here (they are env secretKeyRefs).
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(job, config_map_name(job.name)),
        "data": {
            GRPO_CONFIG_KEY: render_trainer_config(job).to_yaml(),
            ACCELERATE_CONFIG_KEY: render_accelerate_yaml(job),
            DEEPSPEED_CONFIG_KEY: render_deepspeed_json(job),
        },
    }


def needs_rendezvous_service(job: ColocGRPOJob) -> bool:
    """Whether the job gets the headless Service for rank 0's DNS name: only when its gang spans pods.

    Args:
        job: a validated job.

    Returns:
        True for `spec.resources.nodes > 1`. With one node every rank runs in the one pod and nothing
        resolves `<job>-0.<job>`:

        - the pod's `MASTER_ADDR` is the loopback address (`master_address`), for a `spec.command` that reads it;
        - `accelerate launch` (accelerate 1.15, `utils/launch.py`) reads the config's `main_process_ip` only for
          more than one machine: with one, its DeepSpeed launcher starts torchrun without `--master_addr`, so
          torchrun rendezvouses on its default, 127.0.0.1, and gives every worker `MASTER_ADDR=127.0.0.1`,
          whatever the pod's variable says (checked by launching the rendered accelerate.yaml of a 1-node,
          2-process job). Its simple launcher (`distributed_type: NO`) reads it only for more than one process,
          and a 1-node job of that type has one. So accelerate.yaml keeps `main_process_ip: <job>-0.<job>`
          (launch_config.py): unresolvable for one node, and unread;
        - a 1-node CPU job runs the trainer without a launcher (`trainer_command`).

        A 1-node job made by an older operator keeps the Service it got then: the only child the operator
        deletes is a failed gang's batch Job, and the Service goes with its job by garbage collection.
    """
    return job.spec.resources.nodes > 1


def master_address(job: ColocGRPOJob) -> str:
    """Rank 0's address for `MASTER_ADDR`: its DNS name through the headless Service when the gang spans
    pods, the loopback address when every rank is in one pod (`needs_rendezvous_service`)."""
    return rank0_address(job.name) if needs_rendezvous_service(job) else LOOPBACK_ADDRESS


def render_service(job: ColocGRPOJob) -> dict[str, Any]:
    """Headless Service: gives pod `<job>-<index>` the DNS name `<job>-<index>.<job>` for rendezvous.

    Rendered for every job it is called with; `render_children` calls it only for jobs that need it
    (`needs_rendezvous_service`: more than one node).
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(job, service_name(job.name)),
        "spec": {
            "clusterIP": "None",
            # Rank 0 must be resolvable before it is Ready (it is never "ready" in a serving sense).
            "publishNotReadyAddresses": True,
            "selector": {JOB_NAME_LABEL: job.name},
            "ports": [
                {"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT, "protocol": "TCP"}
            ],
        },
    }


def trainer_command(job: ColocGRPOJob) -> list[str]:
    if job.spec.command:
        return list(job.spec.command)
    config = f"{CONFIG_MOUNT_DIR}/{GRPO_CONFIG_KEY}"
    if job.is_cpu_job and job.spec.resources.nodes == 1:
        return ["colocgrpo-train", "--config", config]  # the trainer's console script, no launcher
    # `accelerate launch`, exiting with the code the ranks agreed on (143 on a preemption). $(MACHINE_RANK)
    # is expanded by the kubelet from the container's env. Every process runs `python -m colocgrpo_training`,
    # the module behind `colocgrpo-train`.
    return [
        "colocgrpo-launch",
        "--config_file",
        f"{CONFIG_MOUNT_DIR}/{ACCELERATE_CONFIG_KEY}",
        "--machine_rank",
        "$(MACHINE_RANK)",
        "-m",
        "colocgrpo_training",
        "--config",
        config,
    ]


def trainer_env(job: ColocGRPOJob) -> list[dict[str, Any]]:
    spec = job.spec
    gpus = spec.resources.gpus_per_node
    collective_timeout = spec.run_policy.collective_timeout_seconds()
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # Rendezvous: rank 0's stable DNS name through the headless Service (loopback for one node).
        {"name": "MASTER_ADDR", "value": master_address(job)},
        {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
        {
            "name": "MACHINE_RANK",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_KEY}']"}},
        },
        {"name": "NUM_MACHINES", "value": str(spec.resources.nodes)},
        {"name": "NUM_PROCESSES", "value": str(job.world_size)},
        {"name": "GPUS_PER_NODE", "value": str(gpus)},
        # A collective that hangs (a dead peer) must fail the pod, not hang the gang forever:
        # async error handling tears the process down when the watchdog times out. The timeouts
        # follow runPolicy.progressDeadlineSeconds (ddp_timeout in grpo.yaml sets the collectives').
        {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
        {"name": "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "value": str(collective_timeout)},
        {"name": "DEEPSPEED_TIMEOUT", "value": str(-(-collective_timeout // 60))},  # minutes, rounded up
        {"name": "NCCL_DEBUG", "value": "WARN"},
        {"name": "HF_HOME", "value": f"{spec.cache.path}/huggingface"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        {"name": "COLOCGRPO_TERMINATION_LOG", "value": TERMINATION_LOG},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if spec.cache.offline:
        env += [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "HF_DATASETS_OFFLINE", "value": "1"}]
    if spec.reward_modules:
        env.append({"name": "PYTHONPATH", "value": REWARD_MODULES_DIR})
    token = spec.secrets.hugging_face_token
    if token:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}}})
    # User additions come last so they can override ours (the kubelet uses the last duplicate).
    env += [item.model_dump(by_alias=True, exclude_none=True) for item in spec.pod_template.env]
    return env


def _resources(job: ColocGRPOJob) -> dict[str, Any]:
    resources = job.spec.resources
    amounts: dict[str, Any] = {}
    if resources.cpu is not None:
        amounts["cpu"] = resources.cpu
    if resources.memory is not None:
        amounts["memory"] = resources.memory
    amounts.update(resources.extra)
    if resources.gpus_per_node > 0:
        amounts[GPU_RESOURCE] = resources.gpus_per_node
    # Requests equal limits: a training gang wants guaranteed, not burstable, resources.
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def _volumes_and_mounts(job: ColocGRPOJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    spec = job.spec
    shm: dict[str, Any] = {"medium": "Memory"}
    if spec.resources.shared_memory is not None:
        shm["sizeLimit"] = spec.resources.shared_memory

    def claim_or_scratch(claim: str | None) -> dict[str, Any]:
        return {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}

    volumes = [
        {"name": "config", "configMap": {"name": config_map_name(job.name)}},
        {"name": "dshm", "emptyDir": shm},
        {"name": "checkpoints", **claim_or_scratch(spec.checkpoint.claim_name)},
        {"name": "cache", **claim_or_scratch(spec.cache.claim_name)},
        # Scratch space writable for whatever uid the pod runs as, whatever the image's /tmp is.
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_MOUNT_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": SHM_DIR},
        {"name": "checkpoints", "mountPath": spec.checkpoint.path},
        {"name": "cache", "mountPath": spec.cache.path},
        {"name": "tmp", "mountPath": TMP_DIR},
    ]
    if spec.reward_modules:
        volumes.append({"name": "reward-modules", "configMap": {"name": spec.reward_modules.config_map_name}})
        mounts.append({"name": "reward-modules", "mountPath": REWARD_MODULES_DIR, "readOnly": True})
    volumes += [v.model_dump(by_alias=True, exclude_none=True) for v in spec.pod_template.volumes]
    mounts += [m.model_dump(by_alias=True, exclude_none=True) for m in spec.pod_template.volume_mounts]
    return volumes, mounts


def _security_contexts(job: ColocGRPOJob) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(pod securityContext, container securityContext or None) for the job's podSecurity level.

    restricted meets the Pod Security Standards' restricted level (runAsNonRoot, a non-zero uid, no privilege
    escalation, all capabilities dropped, RuntimeDefault seccomp). Both levels set fsGroup, so mounted volumes
    (checkpoint PVC, cache) are group-writable for the trainer; OnRootMismatch skips the recursive chown of a big
    cache volume whose root already has the right group.
    """
    security = job.spec.pod_template.pod_security
    pod: dict[str, Any] = {"fsGroup": security.run_as_group, "fsGroupChangePolicy": "OnRootMismatch"}
    if security.level == "baseline":
        return pod, None
    pod.update(
        runAsNonRoot=True,
        runAsUser=security.run_as_user,
        runAsGroup=security.run_as_group,
        seccompProfile={"type": "RuntimeDefault"},
    )
    container = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    return pod, container


def render_pod_template(job: ColocGRPOJob, image: str) -> dict[str, Any]:
    spec = job.spec
    volumes, mounts = _volumes_and_mounts(job)
    container: dict[str, Any] = {
        "name": TRAINER_CONTAINER,
        "image": image,
        "command": trainer_command(job),
        "env": trainer_env(job),
        "ports": [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"}],
        "volumeMounts": mounts,
        "terminationMessagePath": TERMINATION_LOG,
        # The trainer writes a JSON reason there; if it died too hard to write it, the log tail explains.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_security, container_security = _security_contexts(job)
    if container_security is not None:
        container["securityContext"] = container_security
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    resources = _resources(job)
    if resources:
        container["resources"] = resources

    pod_spec: dict[str, Any] = {
        # The operator restarts the whole gang; a single pod must never be restarted in place.
        "restartPolicy": "Never",
        "serviceAccountName": trainer_account_name(job.name),
        # The trainer's rank 0 patches status.progress with this account's token.
        "automountServiceAccountToken": True,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": volumes,
    }
    if needs_rendezvous_service(job):
        # With the headless Service of the same name, pod <job>-<i> resolves as <job>-<i>.<job>.
        pod_spec["subdomain"] = service_name(job.name)
    scheduling = spec.scheduling
    if scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in scheduling.tolerations]
    if scheduling.affinity:
        pod_spec["affinity"] = scheduling.affinity.model_dump(by_alias=True, exclude_none=True)
    if scheduling.priority_class_name:
        pod_spec["priorityClassName"] = scheduling.priority_class_name
    if spec.pod_template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s.name} for s in spec.pod_template.image_pull_secrets]

    # User labels first so ours (which the Service selects on) always win.
    metadata: dict[str, Any] = {"labels": {**spec.pod_template.labels, **child_labels(job)}}
    if spec.pod_template.annotations:
        metadata["annotations"] = dict(spec.pod_template.annotations)
    return {"metadata": metadata, "spec": pod_spec}


def render_batch_job(job: ColocGRPOJob, image: str) -> dict[str, Any]:
    spec = job.spec
    nodes = spec.resources.nodes
    labels = child_labels(job)
    # Kueue's labels, from the job's own labels (or their deprecated spec fields): Kueue admits the Job.
    queue = job_queue(job)
    if queue:
        labels[KUEUE_QUEUE_LABEL] = queue
    priority_class = job_priority_class(job)
    if priority_class:
        labels[KUEUE_PRIORITY_CLASS_LABEL] = priority_class
    suspend = bool(spec.run_policy.suspend or queue)
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        # One failed pod fails the Job at once; the operator then recreates the whole gang
        # (a lone replacement pod could never rejoin the NCCL world of the others).
        "backoffLimit": 0,
        # Do not start a replacement before the old pod is gone: it would hold the GPUs twice.
        "podReplacementPolicy": "Failed",
        # Kueue admits a queued Job by unsuspending it; otherwise suspend follows the spec.
        "suspend": suspend,
        "template": render_pod_template(job, image),
    }
    if spec.run_policy.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.run_policy.active_deadline_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_meta(
            job,
            batch_job_name(job.name),
            labels=labels,
            annotations={SUSPEND_REQUESTED_ANNOTATION: "true" if suspend else "false"},
        ),
        "spec": job_spec,
    }

"""Identity of the ColocGRPOJob API, the names of everything derived from a job, and every
label, annotation and other string the operator, the renderer and the CLI share.

Every child object's name is a pure function of the job's name, so the operator, the
renderer, the trainer and the CLI all agree without passing names around.
"""

from __future__ import annotations

GROUP = "colocgrpo.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "colocgrpojobs"
SINGULAR = "colocgrpojob"
KIND = "ColocGRPOJob"
SHORT_NAMES = ["cgj"]
CRD_NAME = f"{PLURAL}.{GROUP}"

# Label put on every child object and every pod: `kubectl get all -l colocgrpo.io/job-name=<job>`.
JOB_NAME_LABEL = f"{GROUP}/job-name"
# Kueue picks up batch/v1 Jobs carrying this label (and creating them suspended).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# ...and sets the Workload's priority from the WorkloadPriorityClass this label names.
KUEUE_PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
# On the batch Job: the spec.suspend the operator last asked of it ("true" or "false"). A Job suspended while
# this says "false" was suspended by someone else: Kueue's webhook, which with manageJobsWithoutQueueName
# suspends every Job of the namespaces it manages, queue name or not.
SUSPEND_REQUESTED_ANNOTATION = f"{GROUP}/suspend-requested"
# The Job controller puts each pod's completion index (= node rank) in a label and an annotation
# of this name (and in env JOB_COMPLETION_INDEX).
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
# The GPU memory the planner assumes for a job that does not set spec.resources.gpuMemoryGiB
# (render/plan_request.py reads it).
GPU_MEMORY_ANNOTATION = f"{GROUP}/gpu-memory-gib"
GPU_RESOURCE = "nvidia.com/gpu"

# The operator's name towards the API server: server-side apply field manager, Events'
# reporting component, and the managed-by label of every child.
OPERATOR_NAME = "colocgrpo-operator"
TRAINER_APP_NAME = "colocgrpo-trainer"  # app.kubernetes.io/name of every child
# kopf keeps its handler progress and last-handled spec in annotations under this prefix, so
# `kubectl get -o yaml` shows who put them there and nothing collides with another kopf operator.
OPERATOR_ANNOTATION_PREFIX = GROUP
EVENT_NAME_PREFIX = "colocgrpo-"
# The operator's own record of a job (restarts, start and completion times, the final outcome), on
# the job's metadata: the trainer may write the job's status but never its metadata (controller/record.py).
RECORD_ANNOTATION = f"{OPERATOR_ANNOTATION_PREFIX}/record"

# The job's name becomes a Service name (DNS-1035 label, 63 characters) and every pod's
# hostname is `<job>-<completion index>` (also a 63-character DNS label). 52 leaves room
# for an index of up to ten digits and for the `-trainer`/`-config` suffixes, and it is
# the same budget Kubernetes gives CronJob names for the same reason.
MAX_JOB_NAME_LENGTH = 52
DNS_1035_LABEL_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# The trainer image's user (images/trainer/Dockerfile `USER 1000:1000`, Ubuntu's `ubuntu`): the pods run as it by
# default, and volumes are made group-writable for its group (fsGroup). A test checks the Dockerfile agrees.
TRAINER_UID = 1000
TRAINER_GID = 1000

# Where the trainer finds its files inside every pod.
CONFIG_MOUNT_DIR = "/etc/colocgrpo"
# Not under CONFIG_MOUNT_DIR: a ConfigMap volume is read-only, so nothing can be mounted inside it.
REWARD_MODULES_DIR = "/etc/colocgrpo-rewards"
SHM_DIR = "/dev/shm"
TMP_DIR = "/tmp"
# The volumes every trainer pod gets, by name (a user's spec.podTemplate.volumes may not reuse these names).
OPERATOR_VOLUMES = ("config", "dshm", "checkpoints", "cache", "tmp", "reward-modules")
GRPO_CONFIG_KEY = "grpo.yaml"
ACCELERATE_CONFIG_KEY = "accelerate.yaml"
DEEPSPEED_CONFIG_KEY = "deepspeed.json"
RENDEZVOUS_PORT = 29500


def config_map_name(job_name: str) -> str:
    return f"{job_name}-config"


def service_name(job_name: str) -> str:
    # The headless Service shares the job's name so pod DNS names read `<job>-0.<job>`.
    return job_name


def batch_job_name(job_name: str) -> str:
    return job_name


# The trainer's ServiceAccount is `<job><TRAINER_ACCOUNT_SUFFIX>` (the status policy, api/admission.py,
# recognises it by that name).
TRAINER_ACCOUNT_SUFFIX = "-trainer"
# The ValidatingAdmissionPolicy (and its binding) that limits the trainer to status.progress.
TRAINER_STATUS_POLICY = "colocgrpo-trainer-status"


def trainer_account_name(job_name: str) -> str:
    """ServiceAccount, Role and RoleBinding that let the trainer patch only this job's status."""
    return f"{job_name}{TRAINER_ACCOUNT_SUFFIX}"


def rank0_address(job_name: str) -> str:
    """DNS name of the completion-index-0 pod through the headless Service (same namespace), which only a
    job of more than one node gets (render/workload.py, `needs_rendezvous_service`)."""
    return f"{job_name}-0.{service_name(job_name)}"

"""The ColocGRPOJob API (colocgrpo.io/v1alpha1): typed model, validation and CRD.

from colocgrpo_operator.api import ColocGRPOJob, parse_job, JobSpecError, generate_crd
"""

from colocgrpo_operator.api.crd import generate_crd
from colocgrpo_operator.api.model import (
    ColocGRPOJob,
    ColocGRPOJobSpec,
    ColocGRPOJobStatus,
    Condition,
    ConditionType,
    Phase,
    ProgressStatus,
    WorkersStatus,
)
from colocgrpo_operator.api.naming import (
    API_VERSION,
    COMPLETION_INDEX_KEY,
    CRD_NAME,
    GPU_MEMORY_ANNOTATION,
    GPU_RESOURCE,
    GROUP,
    JOB_NAME_LABEL,
    KIND,
    KUEUE_PRIORITY_CLASS_LABEL,
    KUEUE_QUEUE_LABEL,
    MAX_JOB_NAME_LENGTH,
    OPERATOR_NAME,
    PLURAL,
    SHORT_NAMES,
    VERSION,
)
from colocgrpo_operator.api.validation import JobSpecError, parse_job, spec_change_problems

__all__ = [
    "API_VERSION",
    "COMPLETION_INDEX_KEY",
    "CRD_NAME",
    "GPU_MEMORY_ANNOTATION",
    "GPU_RESOURCE",
    "GROUP",
    "JOB_NAME_LABEL",
    "KIND",
    "KUEUE_PRIORITY_CLASS_LABEL",
    "KUEUE_QUEUE_LABEL",
    "MAX_JOB_NAME_LENGTH",
    "OPERATOR_NAME",
    "PLURAL",
    "SHORT_NAMES",
    "VERSION",
    "ColocGRPOJob",
    "ColocGRPOJobSpec",
    "ColocGRPOJobStatus",
    "Condition",
    "ConditionType",
    "JobSpecError",
    "Phase",
    "ProgressStatus",
    "WorkersStatus",
    "generate_crd",
    "parse_job",
    "spec_change_problems",
]

"""Pure renderer: a ColocGRPOJob in, the Kubernetes objects the operator creates out.

    from colocgrpo_operator.render import plan_job, render_children, render_trainer_config

No cluster access and no owner references here (the operator adopts the children).
"""

from __future__ import annotations

from typing import Any

from colocgrpo_operator.api.model import ColocGRPOJob
from colocgrpo_operator.render.launch_config import (
    accelerate_config,
    deepspeed_config,
    render_accelerate_yaml,
    render_deepspeed_json,
)
from colocgrpo_operator.render.plan_request import plan_job, plan_request
from colocgrpo_operator.render.rbac import render_role, render_role_binding, render_service_account
from colocgrpo_operator.render.trainer_config import render_trainer_config
from colocgrpo_operator.render.workload import (
    DEFAULT_TRAINER_IMAGE,
    child_labels,
    master_address,
    needs_rendezvous_service,
    render_batch_job,
    render_config_map,
    render_service,
)


def trainer_image(job: ColocGRPOJob, default_image: str | None = None) -> str:
    """spec.image, else the operator's --trainer-image, else colocgrpo/trainer:<version>."""
    return job.spec.image or default_image or DEFAULT_TRAINER_IMAGE


def render_children(job: ColocGRPOJob, *, default_image: str | None = None) -> list[dict[str, Any]]:
    """Every child object, in a safe creation order (RBAC and config before the pods that use them).

    Args:
        job: a validated job.
        default_image: the trainer image when `spec.image` is unset (the operator's `--trainer-image`).

    Returns:
        ServiceAccount, Role, RoleBinding, ConfigMap, the headless Service (only for a job of more than one
        node: `needs_rendezvous_service`) and the Indexed batch Job, last.
    """
    children = [render_service_account(job), render_role(job), render_role_binding(job), render_config_map(job)]
    if needs_rendezvous_service(job):
        children.append(render_service(job))
    children.append(render_batch_job(job, trainer_image(job, default_image)))
    return children


__all__ = [
    "DEFAULT_TRAINER_IMAGE",
    "accelerate_config",
    "child_labels",
    "deepspeed_config",
    "master_address",
    "needs_rendezvous_service",
    "plan_job",
    "plan_request",
    "render_accelerate_yaml",
    "render_batch_job",
    "render_children",
    "render_config_map",
    "render_deepspeed_json",
    "render_role",
    "render_role_binding",
    "render_service",
    "render_service_account",
    "render_trainer_config",
    "trainer_image",
]

"""A cluster file checked against the gateway.yaml that names it (`gateway check-config`
and every load of gateway.yaml, through the entry point `check`)."""

from __future__ import annotations

import os

from gateway.config.schema import AdmissionConfig
from gateway.config.source import Loc, Problem, Source
from gateway.config.validation import as_dict, as_list, at
from gateway_control.cluster_config import check_cluster


def cluster_problems(source: Source, path: str) -> list[Problem]:
    """The cluster file's own problems, and how it fits gateway.yaml's models.

    `source` is gateway.yaml's, `path` the cluster file it names. Every deployment must
    be of a model gateway.yaml defines, and every model without `replicas` must be
    deployed. Problems are at the line of the file they are in.
    """
    _, cluster_source, problems = check_cluster(path)
    if not cluster_source.parsed:
        return problems  # unreadable or not YAML: its deployments are unknown
    # On the plain data, so these show up along with the file's own problems.
    models = as_dict(as_dict(source.data).get("models"))
    gateway_name = os.path.basename(source.file)
    deployed = set()
    for i, deployment in enumerate(as_list(as_dict(cluster_source.data).get("deployments"))):
        model = as_dict(deployment).get("model")
        if not isinstance(model, str):
            continue  # the file's own check reports it
        deployed.add(model)
        if model not in models:
            loc: Loc = ("deployments", i, "model")
            message = f"model '{model}' is not defined in {gateway_name}"
            problems.append(cluster_source.problem(loc, at(loc, message)))
    # The batch classes the closed loop tells apart are gateway.yaml's admission classes.
    admission = as_dict(as_dict(source.data).get("admission"))
    classes = as_list(admission.get("classes")) or AdmissionConfig().classes
    autoscaling = as_dict(as_dict(cluster_source.data).get("autoscaling"))
    for i, name in enumerate(as_list(autoscaling.get("batch_classes"))):
        if isinstance(name, str) and name not in classes:
            loc = ("autoscaling", "batch_classes", i)
            known = ", ".join(str(c) for c in classes)
            message = f"'{name}' is not an admission class of {gateway_name} ({known})"
            problems.append(cluster_source.problem(loc, at(loc, message)))
    cluster_name = os.path.basename(path)
    for name, config in models.items():
        if (
            isinstance(config, dict)
            and not config.get("replicas")
            and not config.get("discovery")
            and name not in deployed
        ):
            loc = ("models", name, "replicas")
            message = f"no replicas, and {cluster_name} has no deployment of '{name}'"
            problems.append(source.problem(loc, at(loc, message)))
    return problems

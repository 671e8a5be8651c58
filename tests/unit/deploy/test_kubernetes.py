"""The Kubernetes manifests (deploy/kubernetes/): every overlay rendered with
`kubectl kustomize`, every object validated, and the properties a deployment relies on.

Rendered objects per overlay (EXPECTED_OBJECTS below; a change there is deliberate):

    dev              22   production 21   production-keda 20
    production + components/kubernetes-api-access: 24

Built-in kinds are validated with `kubernetes-validate` against the Kubernetes
KUBERNETES_VERSION schemas, strictly (an unknown field is an error). The CRDs
(ServiceMonitor, PrometheusRule, ScaledObject) have no schema in that package: they are
checked against CRD_SCHEMAS below, a structural check of the fields these manifests and
their operators rely on, written from the CRDs' published specs (prometheus-operator
monitoring.coreos.com/v1, KEDA keda.sh/v1alpha1); it is not their full schema.

Needs `kubectl` (with its built-in kustomize) on PATH; it is on these machines and in CI,
so its absence fails rather than skips.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway.observability import metrics

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy" / "kubernetes"
RULES = ROOT / "config" / "alerts" / "gateway.rules.yaml"
DASHBOARD = ROOT / "config" / "grafana" / "gateway.json"

# The oldest Kubernetes the manifests support (the kubelet's preStop `sleep` action is on
# by default from 1.30). kubernetes-validate picks its newest schemas not newer than this.
KUBERNETES_VERSION = "1.31"

EXPECTED_OBJECTS = {"dev": 22, "production": 21, "production-keda": 20}
OVERLAYS = tuple(EXPECTED_OBJECTS)

# What the gateway pods read from the Secret `gateway-secrets` (dev generates it, the
# team creates it in production: docs/deployment.md and overlays/production say so).
SECRET_KEYS = {"GATEWAY_REDIS_URL", "GATEWAY_ADMIN_KEY"}

GATEWAY_LABELS = {"app.kubernetes.io/name": "gateway"}
# Per model: its Triton Deployment and headless Service (named so that replica discovery
# can read `triton-<model>.<namespace>.svc.cluster.local`).
TRITON_SERVERS = {
    "llm-large": "triton-llm-large",
    "llm-small": "triton-llm-small",
    "embed-small": "triton-embed-small",
}

Manifest = dict[str, Any]


# -- rendering ---------------------------------------------------------------------------


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl is not on PATH: it renders the manifests (`kubectl kustomize`, "
            "built in since kubectl 1.14). Install kubectl to run these tests."
        )
    return path


def render(directory: Path) -> list[Manifest]:
    """`kubectl kustomize DIRECTORY`, as objects."""
    result = subprocess.run(
        [_kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Manifest]]:
    return {name: render(DEPLOY / "overlays" / name) for name in OVERLAYS}


def with_component(tmp: Path, component: str) -> list[Manifest]:
    """The production overlay with its commented-out line of `component` uncommented,
    as a team enables it, rendered from a copy of the tree."""
    copy = tmp / "kubernetes"
    shutil.copytree(DEPLOY, copy)
    kustomization = copy / "overlays" / "production" / "kustomization.yaml"
    line = f"  # - ../../components/{component}\n"
    text = kustomization.read_text()
    assert text.count(line) == 1, f"overlays/production no longer offers {component}"
    kustomization.write_text(text.replace(line, line.replace("# ", "")))
    return render(copy / "overlays" / "production")


@pytest.fixture(scope="module")
def with_api_access(tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    return with_component(tmp_path_factory.mktemp("deploy"), "kubernetes-api-access")


@pytest.fixture(scope="module")
def with_collector(tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    return with_component(tmp_path_factory.mktemp("deploy"), "otel-collector")


def find(objects: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objects: list[Manifest], kind: str, name: str) -> Manifest:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def configmap(objects: list[Manifest], prefix: str) -> Manifest:
    """The ConfigMap named `prefix`, or `prefix-<hash>` (a kustomize generator's)."""
    found = [
        o
        for o in find(objects, "ConfigMap")
        if re.fullmatch(rf"{re.escape(prefix)}(-[a-z0-9]{{10}})?", o["metadata"]["name"])
    ]
    assert len(found) == 1, f"expected one ConfigMap {prefix}, found {len(found)}"
    return found[0]


def gateway_deployment(objects: list[Manifest]) -> Manifest:
    return one(objects, "Deployment", "gateway")


def gateway_container(objects: list[Manifest]) -> Manifest:
    containers = gateway_deployment(objects)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "gateway")


def pod_templates(objects: list[Manifest]) -> Iterator[tuple[Manifest, Manifest]]:
    """(workload, pod template) of every workload."""
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            yield o, o["spec"]["template"]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def gateway_yaml(objects: list[Manifest]) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(
        configmap(objects, "gateway-config")["data"]["gateway.yaml"]
    )
    return data


def probe_path(probe: Manifest) -> str:
    path: str = probe["httpGet"]["path"]
    return path


# -- counts and schemas ------------------------------------------------------------------


def test_object_counts(rendered: dict[str, list[Manifest]]) -> None:
    counts = {name: len(objects) for name, objects in rendered.items()}
    print(f"rendered objects per overlay: {counts}")
    assert counts == EXPECTED_OBJECTS


def test_kubernetes_validate_ships_the_pinned_version() -> None:
    versions = kubernetes_validate.utils.all_versions()
    assert any(v.startswith(f"{KUBERNETES_VERSION}.") for v in versions), versions


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_builtin_objects_validate(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    problems, validated = [], 0
    for o in rendered[overlay]:
        if o["kind"] in CRD_SCHEMAS:
            continue
        where = f"{o['kind']}/{o['metadata']['name']}"
        try:
            version = kubernetes_validate.validate(o, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{where}: {exc.message}")
        else:
            assert version == KUBERNETES_VERSION
            validated += 1
    assert not problems, "\n".join(problems)
    assert validated == len(rendered[overlay]) - sum(
        o["kind"] in CRD_SCHEMAS for o in rendered[overlay]
    )


def test_the_validation_is_strict(rendered: dict[str, list[Manifest]]) -> None:
    """A misspelt field fails: the check above is not vacuous."""
    deployment = json.loads(json.dumps(gateway_deployment(rendered["production"])))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_every_namespaced_object_has_the_overlays_namespace(
    rendered: dict[str, list[Manifest]],
) -> None:
    for overlay, objects in rendered.items():
        (namespace,) = find(objects, "Namespace")
        for o in objects:
            if o["kind"] != "Namespace":
                assert o["metadata"].get("namespace") == namespace["metadata"]["name"], (
                    f"{overlay}: {o['kind']}/{o['metadata']['name']}"
                )


# -- the CRDs ----------------------------------------------------------------------------

_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253}
_METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {
        "name": _NAME,
        "namespace": _NAME,
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)(y|w|d|h|m|s|ms))+)$"}
_LABEL_SELECTOR = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array"},
    },
}


def _crd(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
    }


CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    # prometheus-operator: which Services to scrape, on which named port and path.
    "ServiceMonitor": _crd(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        {
            "type": "object",
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": _LABEL_SELECTOR,
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string", "minLength": 1},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                        },
                    },
                },
            },
        },
    ),
    # prometheus-operator: Prometheus rule groups; each rule records or alerts, never both.
    "PrometheusRule": _crd(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "record": {"type": "string"},
                                        "alert": {"type": "string"},
                                        "expr": {"type": ["string", "integer"]},
                                        "for": _DURATION,
                                        "keep_firing_for": _DURATION,
                                        "labels": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                    },
                                    "oneOf": [
                                        {"required": ["record"], "not": {"required": ["alert"]}},
                                        {"required": ["alert"], "not": {"required": ["record"]}},
                                    ],
                                },
                            },
                        },
                    },
                },
            },
        },
    ),
    # KEDA: the workload to scale and its triggers. A trigger's metadata values must be
    # strings (KEDA refuses `threshold: 200`).
    "ScaledObject": _crd(
        "keda.sh/v1alpha1",
        "ScaledObject",
        {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": _NAME,
                        "kind": {"type": "string"},
                        "apiVersion": {"type": "string"},
                    },
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string", "minLength": 1},
                            "metadata": {
                                "type": "object",
                                "minProperties": 1,
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    ),
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_custom_resources_pass_the_structural_check(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    checked = set()
    for o in rendered[overlay]:
        if o["kind"] in CRD_SCHEMAS:
            jsonschema.validate(o, CRD_SCHEMAS[o["kind"]])
            checked.add(o["kind"])
    assert {"ServiceMonitor", "PrometheusRule"} <= checked


def test_the_structural_check_refuses_what_operators_would() -> None:
    with pytest.raises(jsonschema.ValidationError):  # a number where KEDA wants a string
        jsonschema.validate(
            {
                "apiVersion": "keda.sh/v1alpha1",
                "kind": "ScaledObject",
                "metadata": {"name": "gateway", "namespace": "ns"},
                "spec": {
                    "scaleTargetRef": {"name": "gateway"},
                    "triggers": [{"type": "prometheus", "metadata": {"threshold": 200}}],
                },
            },
            CRD_SCHEMAS["ScaledObject"],
        )


# -- the gateway pods --------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_runs_as_non_root_on_a_read_only_root(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    pod = gateway_deployment(rendered[overlay])["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    for container in pod["containers"]:
        security = container["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] == 10001
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert security["seccompProfile"]["type"] == "RuntimeDefault"
        assert container["resources"]["requests"] and container["resources"]["limits"]
    # Writable places on the read-only root: /tmp, and the metric files of the workers.
    mounts = {
        m["mountPath"]: m["name"] for m in gateway_container(rendered[overlay])["volumeMounts"]
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    env = {e["name"]: e.get("value") for e in gateway_container(rendered[overlay])["env"]}
    workers = gateway_container(rendered[overlay])["args"]
    if int(workers[workers.index("--workers") + 1]) > 1:
        assert "emptyDir" in volumes[mounts[env["PROMETHEUS_MULTIPROC_DIR"]]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_meets_the_restricted_pod_security_standard(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    """The namespaces enforce `restricted`: a pod that does not meet it is never created."""
    objects = rendered[overlay]
    (namespace,) = find(objects, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    allowed_volumes = {"configMap", "emptyDir", "persistentVolumeClaim", "secret", "projected"}
    for workload, template in pod_templates(objects):
        pod = template["spec"]
        where = f"{overlay}: {workload['metadata']['name']}"
        assert not pod.get("hostNetwork") and not pod.get("hostPID"), where
        for volume in pod.get("volumes", []):
            assert set(volume) - {"name"} <= allowed_volumes, where
        for container in pod["containers"]:
            security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
            assert security.get("runAsNonRoot") is True, where
            assert security.get("runAsUser", 1) != 0, where
            assert security.get("allowPrivilegeEscalation") is False, where
            assert security.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not security.get("privileged"), where
            assert security.get("seccompProfile", {}).get("type") == "RuntimeDefault", where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rollout_never_drops_capacity_and_lets_streams_finish(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    deployment = gateway_deployment(rendered[overlay])
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    pod = deployment["spec"]["template"]["spec"]
    container = gateway_container(rendered[overlay])
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    config = gateway_yaml(rendered[overlay])
    grace = config["server"]["shutdown_grace_s"]
    # SIGTERM comes after the preStop sleep; the in-flight requests then get `grace`.
    assert pod["terminationGracePeriodSeconds"] > pre_stop + grace
    # ... which is as long as the longest request a model allows.
    assert grace >= max(m["timeouts"]["total_s"] for m in config["models"].values())
    assert pre_stop >= 5, "endpoint removal needs a few seconds to reach every proxy"


def gateway_pods(objects: list[Manifest]) -> int:
    """How many gateway pods run (at least): the autoscaler's minimum where one owns the
    count, else the Deployment's."""
    for o in find(objects, "HorizontalPodAutoscaler"):
        return int(o["spec"]["minReplicas"])
    for o in find(objects, "ScaledObject"):
        return int(o["spec"]["minReplicaCount"])
    return int(gateway_deployment(objects)["spec"]["replicas"])


def test_replica_counts(rendered: dict[str, list[Manifest]]) -> None:
    assert gateway_deployment(rendered["dev"])["spec"]["replicas"] == 1
    for overlay in ("production", "production-keda"):
        assert gateway_pods(rendered[overlay]) == 3
        # The autoscaler owns the count: a `replicas` in the manifest would reset it at
        # every apply, stopping the pods above it mid-stream.
        assert "replicas" not in gateway_deployment(rendered[overlay])["spec"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rate_limit_replicas_are_pods_times_workers(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    container = gateway_container(rendered[overlay])
    env = {e["name"]: e.get("value") for e in container["env"]}
    workers = int(container["args"][container["args"].index("--workers") + 1])
    assert int(env["GATEWAY_RATELIMIT_REPLICAS"]) == gateway_pods(rendered[overlay]) * workers


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    container = gateway_container(rendered[overlay])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "ops": 8081}
    assert probe_path(container["livenessProbe"]) == "/livez"
    assert probe_path(container["startupProbe"]) == "/livez"
    assert probe_path(container["readinessProbe"]) == "/readyz"
    # Readiness on the port the API Service sends traffic to.
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    config = gateway_yaml(rendered[overlay])["server"]
    assert (config["port"], config["ops"]["port"]) == (8080, 8081)
    assert config["host"] == config["ops"]["host"] == "0.0.0.0"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_config_is_mounted_as_directories_that_reload(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    objects = rendered[overlay]
    pod = gateway_deployment(objects)["spec"]["template"]["spec"]
    container = gateway_container(objects)
    for c in pod["containers"] + pod.get("initContainers", []):
        for mount in c.get("volumeMounts", []):
            assert "subPath" not in mount and "subPathExpr" not in mount, mount
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    configmaps = {v["name"]: v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    by_configmap = {configmaps[name]: mounts[name] for name in configmaps}

    # gateway.yaml: a hashed name, so an edit is a rollout (it is read at start only).
    config = configmap(objects, "gateway-config")
    assert config["metadata"]["name"] != "gateway-config"
    config_dir = by_configmap[config["metadata"]["name"]]
    args = container["args"]
    assert args[args.index("--config") + 1] == f"{config_dir}/gateway.yaml"
    # tenants.yaml: the same name whatever its content, so an edit reaches the running pods.
    tenants = one(objects, "ConfigMap", "gateway-tenants")
    tenants_dir = by_configmap["gateway-tenants"]
    assert set(tenants["data"]) == {"tenants.yaml"}
    tenants_file = gateway_yaml(objects)["tenants_file"]
    assert os.path.normpath(f"{config_dir}/{tenants_file}") == f"{tenants_dir}/tenants.yaml"
    assert gateway_yaml(objects)["server"]["watch_tenants_file"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_service_account_token(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    for workload, template in pod_templates(rendered[overlay]):
        assert template["spec"]["automountServiceAccountToken"] is False, workload["metadata"]
    assert not find(rendered[overlay], "ServiceAccount")
    assert not find(rendered[overlay], "Role")


def validate_all(objects: list[Manifest]) -> None:
    """Each object against its schema: Kubernetes' own, or its CRD's."""
    for o in objects:
        if o["kind"] in CRD_SCHEMAS:
            jsonschema.validate(o, CRD_SCHEMAS[o["kind"]])
        else:
            kubernetes_validate.validate(o, KUBERNETES_VERSION, strict=True)


def test_kubernetes_api_access_component(with_api_access: list[Manifest]) -> None:
    """The optional component: a ServiceAccount whose Role reads EndpointSlices and
    holds a Lease, and the gateways (only) running as it with a token."""
    objects = with_api_access
    assert len(objects) == EXPECTED_OBJECTS["production"] + 3
    validate_all(objects)
    account = one(objects, "ServiceAccount", "gateway")
    role = one(objects, "Role", "gateway")
    binding = one(objects, "RoleBinding", "gateway")
    granted = {(group, resource) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"]}  # fmt: skip
    assert granted == {
        ("discovery.k8s.io", "endpointslices"), ("coordination.k8s.io", "leases"),
        ("apps", "deployments/scale"),  # the closed loop's replicas of a Deployment
    }  # fmt: skip
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gateway", "namespace": account["metadata"]["namespace"]}
    ]
    pod = gateway_deployment(objects)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gateway"
    assert pod["automountServiceAccountToken"] is True
    for workload, template in pod_templates(objects):
        if workload["metadata"]["name"] != "gateway":
            assert template["spec"]["automountServiceAccountToken"] is False


def test_otel_collector_component(with_collector: list[Manifest]) -> None:
    """The optional component: a Collector taking OTLP on 4317 and 4318, the gateways
    pointed at it by the standard environment, and every Triton tracing to it."""
    objects = with_collector
    assert len(objects) == EXPECTED_OBJECTS["production"] + 4
    validate_all(objects)
    service = one(objects, "Service", "otel-collector")
    assert {p["port"] for p in service["spec"]["ports"]} == {4317, 4318}
    config = yaml.safe_load(configmap(objects, "otel-collector")["data"]["collector.yaml"])
    protocols = config["receivers"]["otlp"]["protocols"]
    assert (protocols["grpc"]["endpoint"], protocols["http"]["endpoint"]) == (
        "0.0.0.0:4317", "0.0.0.0:4318"
    )  # fmt: skip
    pipeline = config["service"]["pipelines"]["traces"]
    assert set(pipeline["exporters"]) <= set(config["exporters"])
    assert set(pipeline["processors"]) <= set(config["processors"])
    env = {e["name"]: e.get("value") for e in gateway_container(objects)["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    names = [e["name"] for e in gateway_container(objects)["env"]]
    assert names.index("POD_NAMESPACE") < names.index("OTEL_RESOURCE_ATTRIBUTES")
    tritons = [
        d for d in find(objects, "Deployment") if d["metadata"]["name"].startswith("triton-")
    ]
    assert tritons
    for triton in tritons:
        args = triton["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--trace-config=mode=opentelemetry" in args
        assert "--trace-config=rate=0" in args
        assert "--trace-config=opentelemetry,url=http://otel-collector:4318/v1/traces" in args
        # Each names itself (its instance label), read from the pod's labels.
        container = triton["spec"]["template"]["spec"]["containers"][0]
        (instance,) = container["env"]
        labels = triton["spec"]["template"]["metadata"]["labels"]
        assert "app.kubernetes.io/instance" in labels
        assert instance["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.labels['app.kubernetes.io/instance']"
        )
        assert "--trace-config=opentelemetry,resource=service.name=$(TRITON_INSTANCE)" in args
    policy = one(objects, "NetworkPolicy", "otel-collector-from-senders")
    (allowed,) = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"]
    assert set(allowed["values"]) == {"gateway", "triton"}


# -- Services, disruption budget, secrets -------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_api_and_ops_services_are_apart(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    objects = rendered[overlay]
    labels = gateway_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    api = one(objects, "Service", "gateway")
    ops = one(objects, "Service", "gateway-ops")
    for service in (api, ops):
        assert matches(service["spec"]["selector"], labels)
    assert [(p["port"], p["targetPort"]) for p in api["spec"]["ports"]] == [(8080, "http")]
    assert [(p["port"], p["targetPort"]) for p in ops["spec"]["ports"]] == [(8081, "ops")]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budget(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    objects = rendered[overlay]
    (budget,) = find(objects, "PodDisruptionBudget")
    assert budget["spec"].get("maxUnavailable") == 1 or budget["spec"].get("minAvailable") == 1
    labels = gateway_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    assert matches(budget["spec"]["selector"]["matchLabels"], labels)


def test_secrets(rendered: dict[str, list[Manifest]]) -> None:
    """dev generates its (fake) Secret; production reads the one the team creates."""
    (secret,) = find(rendered["dev"], "Secret")
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert set(values) == SECRET_KEYS
    assert "FAKE" in values["GATEWAY_ADMIN_KEY"]
    refs = gateway_container(rendered["dev"])["envFrom"]
    assert refs == [{"secretRef": {"name": secret["metadata"]["name"]}}]
    for overlay in ("production", "production-keda"):
        assert not find(rendered[overlay], "Secret")
        refs = gateway_container(rendered[overlay])["envFrom"]
        assert refs == [{"secretRef": {"name": "gateway-secrets"}}]
    docs = (ROOT / "docs" / "deployment.md").read_text()
    assert all(key in docs for key in SECRET_KEYS)


# -- the config in the ConfigMaps ---------------------------------------------------------


def _pod_environment(objects: list[Manifest]) -> dict[str, str]:
    """The gateway container's environment as Kubernetes would set it: its `env`, the
    downward API's namespace, and the Secret (dev's, or stand-ins for production's)."""
    namespace = gateway_deployment(objects)["metadata"]["namespace"]
    env = {}
    for entry in gateway_container(objects)["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
            env[entry["name"]] = namespace
    secrets = find(objects, "Secret")
    if secrets:
        env.update({k: base64.b64decode(v).decode() for k, v in secrets[0]["data"].items()})
    else:
        env.update({"GATEWAY_REDIS_URL": "rediss://redis.example:6379/0",
                    "GATEWAY_ADMIN_KEY": "sk-stand-in"})  # fmt: skip
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_check_config_accepts_the_configmaps(
    rendered: dict[str, list[Manifest]], overlay: str, tmp_path: Path
) -> None:
    """`gateway check-config` on the ConfigMaps' files, laid out as the pod mounts them,
    with nothing in the environment but what the pod has."""
    objects = rendered[overlay]
    (config_dir := tmp_path / "config").mkdir()
    (tenants_dir := tmp_path / "tenants").mkdir()
    config = configmap(objects, "gateway-config")["data"]["gateway.yaml"]
    (config_dir / "gateway.yaml").write_text(config)
    tenants = one(objects, "ConfigMap", "gateway-tenants")["data"]["tenants.yaml"]
    (tenants_dir / "tenants.yaml").write_text(tenants)
    env = {"PATH": os.environ.get("PATH", ""), **_pod_environment(objects)}
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", "--config",
         str(config_dir / "gateway.yaml")],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_tenants_keep_keys_out_of_the_configmaps(rendered: dict[str, list[Manifest]]) -> None:
    for objects in rendered.values():
        text = one(objects, "ConfigMap", "gateway-tenants")["data"]["tenants.yaml"]
        for tenant in yaml.safe_load(text)["tenants"].values():
            for key in tenant["api_keys"]:
                assert re.fullmatch(r"sha256:[0-9a-f]{64}|\$\{[A-Z_][A-Z0-9_]*\}", key), key


# -- Triton ------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_triton_servers(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    objects = rendered[overlay]
    namespace = gateway_deployment(objects)["metadata"]["namespace"]
    models = gateway_yaml(objects)["models"]
    for model, name in TRITON_SERVERS.items():
        deployment = one(objects, "Deployment", name)
        pod = deployment["spec"]["template"]["spec"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        (container,) = pod["containers"]
        assert container["image"].startswith("nvcr.io/nvidia/tritonserver:")
        assert f"--load-model={model}" in container["args"]
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
        assert probe_path(container["readinessProbe"]) == "/v2/health/ready"
        assert probe_path(container["livenessProbe"]) == "/v2/health/live"
        (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert [e["key"] for e in term["matchExpressions"]] == ["nvidia.com/gpu.product"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]
        # The headless Service the gateway reaches (and will discover) the pods through.
        service = one(objects, "Service", name)
        assert service["spec"]["clusterIP"] == "None"
        assert matches(service["spec"]["selector"], labels)
        assert {p["port"] for p in service["spec"]["ports"]} == {8000, 8001, 8002}
        # The model's replicas in gateway.yaml are that Service's pods, found in DNS by
        # its full name, on the port its backend speaks.
        fqdn = f"{name}.{namespace}.svc.cluster.local"
        discovery = models[model]["discovery"]
        dns_name = discovery["dns"].replace("${POD_NAMESPACE}", namespace)
        assert dns_name.replace("${CLUSTER_DOMAIN:-cluster.local}", "cluster.local") == fqdn
        assert "replicas" not in models[model]
        grpc = models[model]["backend"] == "triton_grpc"
        assert discovery["port"] == (8001 if grpc else 8000)


# -- NetworkPolicy -----------------------------------------------------------------------


def _policies_for(objects: list[Manifest], labels: dict[str, str]) -> list[Manifest]:
    return [
        p
        for p in find(objects, "NetworkPolicy")
        if matches(p["spec"]["podSelector"].get("matchLabels", {}), labels)
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_gateways_reach_triton_and_redis(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    objects = rendered[overlay]
    gateway_labels = gateway_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    backends = [
        (workload, template)
        for workload, template in pod_templates(objects)
        if template["metadata"]["labels"]["app.kubernetes.io/name"] in ("triton", "redis")
    ]
    assert len(backends) == len(TRITON_SERVERS) + (overlay == "dev")  # dev runs a Redis
    for workload, template in backends:
        (policy,) = _policies_for(objects, template["metadata"]["labels"])
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        allowed = set()
        for rule in policy["spec"]["ingress"]:
            # Every peer is a pod selector (this namespace) that picks the gateways.
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, workload["metadata"]["name"]
                assert matches(peer["podSelector"]["matchLabels"], gateway_labels)
                assert peer["podSelector"]["matchLabels"] == GATEWAY_LABELS
            allowed |= {p["port"] for p in rule["ports"]}
        (container,) = template["spec"]["containers"]
        assert allowed == {p["containerPort"] for p in container["ports"]}
    # The Redis policy is there in every overlay, for a Redis the team runs here too.
    assert _policies_for(objects, {"app.kubernetes.io/name": "redis"})


def test_the_dev_redis_refuses_writes_when_full_instead_of_evicting(
    rendered: dict[str, list[Manifest]],
) -> None:
    # Issue 40: an eviction policy could drop managed keys, spend or rate-limit buckets
    # to make room for one tenant's stored responses; noeviction refuses the write.
    (container,) = one(rendered["dev"], "Deployment", "redis")["spec"]["template"]["spec"][
        "containers"
    ]
    args = container["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    maxmemory = args[args.index("--maxmemory") + 1]
    assert maxmemory.endswith("mb")
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi") and int(maxmemory[:-2]) * 10**6 < int(limit[:-2]) * 2**20


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_ingress(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    objects = rendered[overlay]
    labels = gateway_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    (policy,) = _policies_for(objects, labels)
    rules = {tuple(p["port"] for p in rule["ports"]): rule for rule in policy["spec"]["ingress"]}
    assert set(rules) == {(8080,), (8081,)}
    assert "from" not in rules[(8080,)]  # the API: any client
    assert rules[(8081,)]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]


# -- monitoring --------------------------------------------------------------------------


def test_generated_monitoring_files_are_current() -> None:
    # deploy/kubernetes/generate.py is a script, not a package module: load it by path.
    spec = importlib.util.spec_from_file_location("k8s_generate", DEPLOY / "generate.py")
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    stale = [str(path.relative_to(ROOT)) for path in generate.stale()]
    assert not stale, f"run `python deploy/kubernetes/generate.py`: {stale} drifted"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_rule_is_config_alerts(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    (rule,) = find(rendered[overlay], "PrometheusRule")
    assert rule["spec"] == {"groups": yaml.safe_load(RULES.read_text())["groups"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grafana_dashboard_is_config_grafana(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    dashboard = one(rendered[overlay], "ConfigMap", "gateway-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["gateway.json"] == DASHBOARD.read_text()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_scrapes_the_ops_port(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    objects = rendered[overlay]
    (monitor,) = find(objects, "ServiceMonitor")
    services = [
        s
        for s in find(objects, "Service")
        if matches(monitor["spec"]["selector"]["matchLabels"], s["metadata"].get("labels", {}))
    ]
    assert [s["metadata"]["name"] for s in services] == ["gateway-ops"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in services[0]["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


# -- autoscaling -------------------------------------------------------------------------

STATE_METRIC_NAMES = {m.name for m in metrics.STATE_METRICS}


def _autoscalers(objects: list[Manifest]) -> list[str]:
    """Which autoscalers target the gateway Deployment."""
    found = []
    for o in find(objects, "HorizontalPodAutoscaler"):
        if o["spec"]["scaleTargetRef"]["name"] == "gateway":
            found.append("hpa")
    for o in find(objects, "ScaledObject"):
        if o["spec"]["scaleTargetRef"]["name"] == "gateway":
            found.append("keda")
    return found


def test_one_autoscaler_at_most(rendered: dict[str, list[Manifest]]) -> None:
    assert _autoscalers(rendered["dev"]) == []
    assert _autoscalers(rendered["production"]) == ["hpa"]
    assert _autoscalers(rendered["production-keda"]) == ["keda"]
    assert not find(rendered["production-keda"], "ConfigMap", "gateway-prometheus-adapter-rules")


def test_hpa_scales_on_a_gateway_metric_the_adapter_serves(
    rendered: dict[str, list[Manifest]],
) -> None:
    objects = rendered["production"]
    (hpa,) = find(objects, "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    assert name in STATE_METRIC_NAMES, f"{name} is not a gateway gauge ({STATE_METRIC_NAMES})"
    assert f'"{name}"' in (ROOT / "gateway" / "observability" / "metrics.py").read_text()
    adapter = one(objects, "ConfigMap", "gateway-prometheus-adapter-rules")
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    served = {rule["name"]["as"]: rule for rule in rules}
    assert name in served
    assert served[name]["seriesQuery"].startswith(f"{name}{{")
    assert served[name]["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert set(served) <= STATE_METRIC_NAMES


def test_keda_scales_on_the_same_metric_in_its_own_namespace(
    rendered: dict[str, list[Manifest]],
) -> None:
    objects = rendered["production-keda"]
    (scaled,) = find(objects, "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    (name,) = re.findall(r"\b(gateway_[a-z_]+)\{", query)
    assert name in STATE_METRIC_NAMES
    assert f'namespace="{scaled["metadata"]["namespace"]}"' in query
    (hpa,) = find(rendered["production"], "HorizontalPodAutoscaler")
    for setting in ("min", "max"):
        assert scaled["spec"][f"{setting}ReplicaCount"] == hpa["spec"][f"{setting}Replicas"]


def test_the_gateway_image_is_set_in_one_place(rendered: dict[str, list[Manifest]]) -> None:
    # An operator sets the registry and tag once (components/gateway-image), and every
    # overlay runs that image: no overlay names an image of its own to forget.
    component = yaml.safe_load((DEPLOY / "components/gateway-image/kustomization.yaml").read_text())
    [entry] = component["images"]
    expected = f"{entry['newName']}:{entry['newTag']}"
    for overlay, objects in rendered.items():
        assert gateway_container(objects)["image"] == expected, overlay
    for kustomization in DEPLOY.rglob("kustomization.yaml"):
        if kustomization.parent.name != "gateway-image":
            assert "images" not in yaml.safe_load(kustomization.read_text()), kustomization

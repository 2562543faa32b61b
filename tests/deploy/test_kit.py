"""The deployment kit (deploy/, issue 26 item 4), checked as far as this machine allows.

- Kubernetes manifests: every document parses and is read strictly into the Kubernetes models of
  kubernetes_asyncio (a project requirement, generated from the Kubernetes OpenAPI description):
  unknown fields, wrong types and missing required fields fail. No kubeconform or cluster here, so
  what only the API server checks (admission, defaulting, cross-object rules) is not covered.
- Against the project itself: the probes' paths answer on the gateway's probe listener, the grace
  period follows --shutdown-grace-period-secs, every environment variable the kit sets is a flag's or
  a setting's, the gateway's arguments and ConfigMap parse with the gateway's own flag parser, the
  secrets come from a Secret only, /metrics is scraped where it is served.
- The compose file: `docker compose config` when the compose plugin is installed, and always the same
  structural checks as above.
- The image definition: its copied tree runs the gateway's commands (checked by copying exactly what it
  copies); `docker build` when a container engine answers `docker info`, else skipped with its answer.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml
from kubernetes_asyncio import client as k8s

from common.config import FLAGS, ConfigError, GatewayConfig, add_gateway_arguments, parse_gateway_args
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_DIR = DEPLOY / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
IMAGE = "inference-gateway"  # the image name the manifests use (kustomization.yaml retags it)

# Variables that hold credentials: only ever from a Secret (manifests) or an ignored file (compose).
SECRET_NAMES = {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "DJANGO_SECRET_KEY", "GW_API_KEY",
                "GW_TENANT_API_KEYS", "GW_CONTROL_PLANE_API_KEYS"}


# --- what the project reads ----------------------------------------------------------------------


def project_env_names() -> set[str]:
    """Every variable the gateway's processes read: a flag's GW_* name, or a setting read by the
    settings module or the commands through common.envconf (env_secret ones also as NAME_FILE)."""
    names = {flag.env_name for flag in FLAGS}
    reader = re.compile(r"\benv_(str|bool|int|list|secret)\(\s*\"([A-Z0-9_]+)\"")
    sources = [ROOT / "gateway_project" / "settings.py", *sorted((ROOT / "administration" / "management").rglob("*.py"))]
    for source in sources:
        for kind, name in reader.findall(source.read_text()):
            names.add(name)
            if kind == "secret":
                names.add(name + "_FILE")
    return names


def test_project_env_names_come_from_the_sources() -> None:
    names = project_env_names()
    # The settings the kit relies on, found by reading the sources (not listed by hand).
    assert {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "DJANGO_SECRET_KEY", "GW_DATA_DIR"} <= names
    assert {"GW_WORKERS", "GW_HEALTH_CHECK_PORT", "GW_SHUTDOWN_GRACE_PERIOD_SECS", "GW_API_KEY"} <= names
    assert "NOT_A_SETTING" not in names


# --- the schema: Kubernetes' own models ---------------------------------------------------------
#
# Each built-in kind is read into the models of kubernetes_asyncio (the client worker discovery uses,
# generated from the Kubernetes OpenAPI description): a key the model does not have fails (a typo such
# as ``readinessprobe`` would otherwise be dropped by a lenient apply), as does a value of the wrong
# type or a required field left out (the models refuse None for those). The ServiceMonitor is a
# Prometheus Operator resource the client does not know: a small table of its fields instead.

MODELS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("batch/v1", "Job"): "V1Job",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
}
SERVICE_MONITOR = ("monitoring.coreos.com/v1", "ServiceMonitor")
SERVICE_MONITOR_KEYS = {"": {"apiVersion", "kind", "metadata", "spec"}, "spec": {"selector", "endpoints"},
                        "endpoint": {"port", "path", "interval"}}
KUSTOMIZATION = ("kustomize.config.k8s.io/v1beta1", "Kustomization")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
PRIMITIVES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float),
                                           "datetime": (str,)}


def read_model(value: Any, type_name: str, where: str) -> Any:
    """``value`` read as the Kubernetes type ``type_name``, strictly (see above)."""
    if (inner := re.fullmatch(r"list\[(.+)\]", type_name)) is not None:
        assert isinstance(value, list), f"{where}: a list expected"
        return [read_model(item, inner.group(1), f"{where}[{i}]") for i, item in enumerate(value)]
    if (inner := re.fullmatch(r"dict\(str, (.+)\)", type_name)) is not None:
        assert isinstance(value, dict), f"{where}: a mapping expected"
        return {key: read_model(item, inner.group(1), f"{where}.{key}") for key, item in value.items()}
    if type_name == "object":  # IntOrString and the like
        return value
    if type_name in PRIMITIVES:
        ok = isinstance(value, PRIMITIVES[type_name]) and (type_name == "bool" or not isinstance(value, bool))
        assert ok, f"{where}: {type_name} expected, got {value!r}"
        return value
    model = getattr(k8s, type_name)
    assert isinstance(value, dict), f"{where}: a {type_name} mapping expected"
    fields = {json_name: name for name, json_name in model.attribute_map.items()}
    unknown = set(value) - set(fields)
    assert not unknown, f"{where}: {type_name} has no field {sorted(unknown)}"
    arguments = {fields[key]: read_model(item, model.openapi_types[fields[key]], f"{where}.{key}")
                 for key, item in value.items()}
    try:
        return model(**arguments)
    except ValueError as exc:  # a required field missing, or a value the model refuses
        pytest.fail(f"{where}: {exc}")


def test_the_schema_check_refuses_what_kubernetes_would() -> None:
    container = {"name": "gateway", "image": IMAGE, "readinessProbe": {"httpGet": {"path": "/readiness", "port": 1}}}
    assert read_model(container, "V1Container", "ok").readiness_probe.http_get.path == "/readiness"
    with pytest.raises(AssertionError, match="no field"):
        read_model({**container, "readinessprobe": {}}, "V1Container", "typo")
    with pytest.raises(AssertionError, match="int expected"):
        read_model({"containerPort": "30000"}, "V1ContainerPort", "type")
    with pytest.raises(pytest.fail.Exception, match="name"):
        read_model({"image": IMAGE}, "V1Container", "required")


def _documents(path: Path) -> list[dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    for doc in docs:
        assert isinstance(doc, dict), f"{path.name}: a document that is not a mapping"
    return docs


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def applied_documents() -> list[dict[str, Any]]:
    """What `kubectl apply -k deploy/k8s` and `-k deploy/k8s/monitoring` apply."""
    docs: list[dict[str, Any]] = []
    for kustomization in (K8S / "kustomization.yaml", K8S / "monitoring" / "kustomization.yaml"):
        for resource in yaml.safe_load(kustomization.read_text())["resources"]:
            docs.extend(_documents(kustomization.parent / resource))
    return docs


def by_kind(kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in applied_documents() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = by_kind(kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _check_pod_template(template: dict[str, Any], where: str) -> None:
    """What the kit holds every pod to beyond the schema: non-root, read-only, no privilege."""
    spec = template["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0, where
    volumes = {v["name"] for v in spec.get("volumes", [])}
    for container in spec.get("initContainers", []) + spec["containers"]:
        cwhere = f"{where} container {container['name']}"
        assert DNS_LABEL.match(container["name"]) and container["image"], cwhere
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, cwhere
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, cwhere
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], cwhere
        for entry in container.get("env", []):
            assert ("value" in entry) != ("valueFrom" in entry), f"{cwhere} env {entry['name']}"
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{cwhere}: mounts an undeclared volume {mount['name']}"


def _check_service_monitor(doc: dict[str, Any], where: str) -> None:
    assert set(doc) <= SERVICE_MONITOR_KEYS[""] and set(doc["spec"]) <= SERVICE_MONITOR_KEYS["spec"], where
    read_model(doc["metadata"], "V1ObjectMeta", f"{where}.metadata")
    read_model(doc["spec"]["selector"], "V1LabelSelector", f"{where}.spec.selector")
    assert doc["spec"]["endpoints"], where
    for endpoint in doc["spec"]["endpoints"]:
        assert set(endpoint) <= SERVICE_MONITOR_KEYS["endpoint"] and "port" in endpoint, where
        assert re.fullmatch(r"\d+(ms|s|m)", endpoint.get("interval", "30s")), where


def test_every_manifest_parses_and_passes_the_schema() -> None:
    files = manifest_files()
    assert files, "no manifests under deploy/k8s"
    seen: set[tuple[str, str]] = set()
    for path in files:
        for doc in _documents(path):
            where = f"{path.relative_to(DEPLOY)}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
            key = (doc.get("apiVersion"), doc.get("kind"))
            if key == SERVICE_MONITOR:
                _check_service_monitor(doc, where)
            else:
                assert key in MODELS, f"{where}: apiVersion/kind {key} is not one the kit uses"
                read_model(doc, MODELS[key], where)
            assert DNS_LABEL.match(doc["metadata"]["name"]), f"{where}: name is not a DNS label"
            seen.add(key)
            if doc["kind"] == "Deployment":
                labels = doc["spec"]["template"]["metadata"]["labels"]
                assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items(), f"{where}: selector misses the pods"
                _check_pod_template(doc["spec"]["template"], where)
            elif doc["kind"] == "Job":
                assert doc["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never"), where
                _check_pod_template(doc["spec"]["template"], where)
    assert seen == set(MODELS) | {SERVICE_MONITOR}, f"kinds in the table but not in the kit: {set(MODELS) - seen}"


def test_the_kustomizations_list_every_manifest_but_the_secret_example() -> None:
    listed: set[Path] = set()
    for kustomization in (K8S / "kustomization.yaml", K8S / "monitoring" / "kustomization.yaml"):
        doc = yaml.safe_load(kustomization.read_text())
        assert (doc["apiVersion"], doc["kind"]) == KUSTOMIZATION
        for resource in doc["resources"]:
            assert (kustomization.parent / resource).is_file(), f"{kustomization}: {resource} missing"
            listed.add((kustomization.parent / resource).resolve())
    assert {p.resolve() for p in manifest_files()} - listed == {(K8S / "secret.example.yaml").resolve()}
    # The images transformer retags the one image every container names.
    images = yaml.safe_load((K8S / "kustomization.yaml").read_text())["images"]
    assert [i["name"] for i in images] == [IMAGE]
    for doc in applied_documents():
        if doc["kind"] in ("Deployment", "Job"):
            for container in doc["spec"]["template"]["spec"].get("initContainers", []) + doc["spec"]["template"]["spec"]["containers"]:
                assert container["image"] == IMAGE


def _kustomize() -> list[str] | None:
    """The command that renders a kustomization here (kubectl's built-in kustomize, or kustomize)."""
    if (kubectl := shutil.which("kubectl")) is not None:
        return [kubectl, "kustomize"]
    if (kustomize := shutil.which("kustomize")) is not None:
        return [kustomize, "build"]
    return None


def test_kustomize_renders_the_kit_as_it_will_be_applied() -> None:
    """`kubectl kustomize` (no cluster needed) renders both kustomizations; what it renders is what
    `kubectl apply -k` sends: every object in the namespace, labelled, the image retagged, the
    RoleBinding's subject in the namespace, and each object still passes the schema."""
    command = _kustomize()
    if command is None:
        pytest.skip("neither kubectl nor kustomize on this machine (the source manifests are checked above)")
    rendered: list[dict[str, Any]] = []
    for directory in (K8S, K8S / "monitoring"):
        result = subprocess.run([*command, str(directory)], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        rendered.extend(doc for doc in yaml.safe_load_all(result.stdout) if doc is not None)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in applied_documents())
    (image,) = yaml.safe_load((K8S / "kustomization.yaml").read_text())["images"]
    for doc in rendered:
        where = f"rendered {doc['kind']} {doc['metadata']['name']}"
        key = (doc["apiVersion"], doc["kind"])
        if key == SERVICE_MONITOR:
            _check_service_monitor(doc, where)
        else:
            read_model(doc, MODELS[key], where)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "inference-gateway", where
        if doc["kind"] in ("Deployment", "Job"):
            pod = doc["spec"]["template"]["spec"]
            assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "inference-gateway", where
            for container in pod.get("initContainers", []) + pod["containers"]:
                assert container["image"] == f"{image['newName']}:{image['newTag']}", where
        if doc["kind"] == "RoleBinding":
            assert doc["subjects"][0]["namespace"] == "inference-gateway"


# --- the gateway Deployment against the gateway ----------------------------------------------------


def gateway_deployment() -> dict[str, Any]:
    return one("Deployment", "inference-gateway")


def gateway_container() -> dict[str, Any]:
    (container,) = [c for c in gateway_deployment()["spec"]["template"]["spec"]["containers"] if c["name"] == "gateway"]
    return container


def config_map() -> dict[str, str]:
    data = one("ConfigMap", "inference-gateway")["data"]
    assert all(isinstance(v, str) for v in data.values()), "ConfigMap values must be strings"
    return data


def _named_port(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


def _expand(arg: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


@pytest.fixture
def gateway_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The ConfigMap's variables in this process's environment (no other GW_* ones)."""
    for name in list(os.environ):
        if name.startswith("GW_"):
            monkeypatch.delenv(name)
    data = config_map()
    for name, value in data.items():
        monkeypatch.setenv(name, value)
    yield data


def test_the_gateway_runs_the_readme_command_and_its_flags_parse(gateway_env: dict[str, str]) -> None:
    container = gateway_container()
    assert container["command"] == ["python", "manage.py", "rungateway"]
    args = [_expand(a, {"POD_NAMESPACE": "inference-gateway"}) for a in container["args"]]
    parser = argparse.ArgumentParser()
    add_gateway_arguments(parser)
    known = {option for action in parser._actions for option in action.option_strings}
    assert not [a for a in args if a.startswith("--") and a not in known], "not the gateway's flags"
    config = parse_gateway_args(args)
    assert config.workers == 2 and config.port == _named_port(container, "http")
    # Kubernetes discovery of the pods labelled as workers, in the namespace the Role covers.
    assert config.service_discovery and config.service_discovery_namespace == "inference-gateway"
    assert config.selector == (("app.kubernetes.io/component", "inference-worker"),)
    assert config.service_discovery_port == 8000


def test_the_config_map_parses_and_matches_the_ports(gateway_env: dict[str, str]) -> None:
    config = parse_gateway_args([])
    container = gateway_container()
    assert config.port == _named_port(container, "http")
    assert config.prometheus_port == _named_port(container, "metrics")
    assert config.health_check_port == _named_port(container, "probes")
    # --workers counts the CPU affinity, which a CPU limit does not narrow: the count is the limit.
    assert str(config.workers) == container["resources"]["limits"]["cpu"]
    assert config.shutdown_grace_period_secs == GatewayConfig().shutdown_grace_period_secs


def test_a_malformed_config_map_value_would_be_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parse above is a real check: the same parser refuses a bad value."""
    monkeypatch.setenv("GW_HEALTH_CHECK_PORT", "probes")
    with pytest.raises(ConfigError):
        parse_gateway_args([])


def test_termination_grace_covers_the_prestop_pause_and_the_drain() -> None:
    spec = gateway_deployment()["spec"]["template"]["spec"]
    pre_stop = gateway_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    pause = float(pre_stop[1])
    drain = float(config_map()["GW_SHUTDOWN_GRACE_PERIOD_SECS"])
    assert drain == GatewayConfig().shutdown_grace_period_secs
    # SIGKILL after the pause, the drain and 5 s to close the upstream clients and flush usage.
    assert spec["terminationGracePeriodSeconds"] == pause + drain + 5
    # A rolling update never takes a serving pod away before its replacement is ready.
    assert gateway_deployment()["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


async def test_the_probe_paths_are_served_on_the_probe_listener() -> None:
    """Start the gateway's own probe listener and ask it for the manifest's paths."""
    from administration.metrics_server import ProbeListener

    container = gateway_container()
    assert container["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "probes"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "probes"}
    assert container["startupProbe"]["httpGet"]["port"] == "probes"
    listener = ProbeListener("127.0.0.1", port := free_port())
    await listener.astart()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                answer = await client.get(container[probe]["httpGet"]["path"])
                assert answer.status_code in (200, 503), (probe, answer.status_code)  # 503: no worker yet
                assert "status" in answer.json()
            assert (await client.get("/liveness")).status_code == 200
            assert (await client.get("/not-a-probe")).status_code == 404  # the check tells paths apart
    finally:
        await listener.astop()


def test_secrets_come_from_the_secret_only() -> None:
    secret_keys = set(yaml.safe_load((K8S / "secret.example.yaml").read_text())["stringData"])
    assert not SECRET_NAMES & set(config_map()), "a credential in the ConfigMap"
    assert not by_kind("Secret"), "a Secret is applied by the kit: it would carry its example values"
    for doc in by_kind("Deployment") + by_kind("Job"):
        for container in doc["spec"]["template"]["spec"].get("initContainers", []) + doc["spec"]["template"]["spec"]["containers"]:
            for entry in container.get("env", []):
                if entry["name"] in SECRET_NAMES:
                    ref = entry["valueFrom"]["secretKeyRef"]
                    assert ref["name"] == "inference-gateway" and ref["key"] == entry["name"], entry
                    assert ref["key"] in secret_keys, f"secret.example.yaml lacks {ref['key']}"
                    # The store, Redis, the broker and the Django secret are required; keys optional.
                    assert ref.get("optional", False) == ("API_KEY" in entry["name"]), entry


def test_every_variable_the_manifests_set_is_the_projects() -> None:
    known = project_env_names()
    for doc in by_kind("Deployment") + by_kind("Job"):
        for container in doc["spec"]["template"]["spec"].get("initContainers", []) + doc["spec"]["template"]["spec"]["containers"]:
            names = {entry["name"] for entry in container.get("env", [])}
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] == "inference-gateway"
                names |= set(config_map())
            # A variable only there for Kubernetes to expand into the arguments, $(NAME).
            expanded = {m for a in container.get("args", []) + container.get("command", [])
                        for m in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a)}
            unknown = names - known - expanded
            assert not unknown, f"{doc['metadata']['name']}/{container['name']}: not a flag or setting: {unknown}"


def test_migrations_run_once_before_gateways_and_celery_workers() -> None:
    job = one("Job", "inference-gateway-migrate")
    (migrate,) = job["spec"]["template"]["spec"]["containers"]
    assert migrate["command"] == ["python", "manage.py", "migrate", "--noinput"]
    for name in ("inference-gateway", "inference-gateway-celery-worker"):
        (wait,) = one("Deployment", name)["spec"]["template"]["spec"]["initContainers"]
        assert "python manage.py migrate --check" in " ".join(wait["command"])


def test_the_celery_worker_runs_the_projects_app() -> None:
    import gateway_project.celery

    (worker,) = one("Deployment", "inference-gateway-celery-worker")["spec"]["template"]["spec"]["containers"]
    assert worker["command"][:4] == ["celery", "-A", "gateway_project", "worker"]
    assert gateway_project.celery.app.main == "gateway_project"
    assert worker["envFrom"] == gateway_container()["envFrom"], "jobs read the same GW_* flags as the gateways"


def test_discovery_rbac_lets_the_gateway_watch_pods() -> None:
    account = one("ServiceAccount")["metadata"]["name"]
    assert gateway_deployment()["spec"]["template"]["spec"]["serviceAccountName"] == account
    for other in (one("Deployment", "inference-gateway-celery-worker"), one("Job")):
        assert other["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    role = one("Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = one("RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    # A Role covers one namespace: the discovery is kept to the pod's own.
    args = gateway_container()["args"]
    assert args[args.index("--service-discovery-namespace") + 1] == "$(POD_NAMESPACE)"
    (namespace,) = [e for e in gateway_container()["env"] if e["name"] == "POD_NAMESPACE"]
    assert namespace["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_the_service_monitor_scrapes_metrics_where_they_are_served() -> None:
    monitor = one("ServiceMonitor")
    service = one("Service", "inference-gateway")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert port["targetPort"] == "metrics"
    assert _named_port(gateway_container(), "metrics") == int(config_map()["GW_PROMETHEUS_PORT"])
    labels = gateway_deployment()["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    budget = one("PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


# --- compose ---------------------------------------------------------------------------------------

COMPOSE_ENV = {"POSTGRES_PASSWORD": "pw", "RABBITMQ_PASSWORD": "pw", "DJANGO_SECRET_KEY": "k"}


def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())  # PyYAML resolves the << merge keys as compose does
    assert isinstance(doc, dict)
    return doc


def _compose_plugin() -> str | None:
    """Why `docker compose` cannot be run here, or None when it can."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker CLI on this machine"
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"the docker CLI has no compose plugin: {(probe.stderr or probe.stdout).strip()}"
    return None


def test_compose_config_accepts_the_file() -> None:
    reason = _compose_plugin()
    if reason:
        pytest.skip(reason + " (the structural checks below still run)")
    env = {**os.environ, **COMPOSE_ENV}
    result = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_compose_starts_the_stack_in_order() -> None:
    services = compose()["services"]
    assert {"postgres", "redis", "rabbitmq", "migrate", "gateway", "celery-worker"} <= set(services)
    for name in ("gateway", "celery-worker"):
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
        assert services[name]["image"] == services["migrate"]["image"]
    assert services["migrate"]["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"]["restart"] == "no"
    for name, dependency in services["gateway"]["depends_on"].items():
        assert name in services and dependency["condition"].startswith("service_"), name
    # The gateway runs the image's command; the Celery worker the project's app.
    assert "command" not in services["gateway"]
    assert services["celery-worker"]["command"][:4] == ["celery", "-A", "gateway_project", "worker"]
    assert services["mock-worker"]["profiles"] == ["demo"]
    build = services["gateway"]["build"]
    assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE


def test_compose_gateway_flags_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = compose()["services"]["gateway"]
    for name in list(os.environ):
        if name.startswith("GW_"):
            monkeypatch.delenv(name)
    for name, value in gateway["environment"].items():
        if name.startswith("GW_"):
            monkeypatch.setenv(name, str(value))
    config = parse_gateway_args([])
    assert gateway["environment"]["GW_WORKERS"] == "auto" and config.workers >= 1
    probe_url = gateway["healthcheck"]["test"][-1]
    assert f"127.0.0.1:{config.health_check_port}/liveness" in probe_url
    assert f"{config.port}:{config.port}" in gateway["ports"]
    assert f"{config.prometheus_port}:{config.prometheus_port}" in gateway["ports"]
    assert gateway["stop_grace_period"] == f"{int(config.shutdown_grace_period_secs) + 10}s"
    assert config.shutdown_grace_period_secs == GatewayConfig().shutdown_grace_period_secs


def test_compose_variables_are_the_projects_and_credentials_are_not_in_the_file() -> None:
    known = project_env_names()
    services = compose()["services"]
    for name in ("migrate", "gateway", "celery-worker", "mock-worker"):
        environment = services[name].get("environment", {})
        assert not set(environment) - known, f"{name}: not a flag or setting: {set(environment) - known}"
        for variable in SECRET_NAMES & set(environment):
            value = str(environment[variable])
            if variable in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SECRET_KEY"):
                assert re.search(r"\$\{[A-Z_]+:\?", value), f"{name} {variable}: a credential written in the file"
    assert "POSTGRES_PASSWORD" not in services["gateway"]["environment"]
    for example in ("gateway.env.example",):
        lines = [ln for ln in (COMPOSE_DIR / example).read_text().splitlines() if ln and not ln.startswith("#")]
        assert {ln.split("=", 1)[0] for ln in lines} <= known, example
    ignored = (DEPLOY / ".gitignore").read_text().split()
    assert {"compose/.env", "compose/gateway.env", "k8s/secret.yaml"} <= set(ignored)


def test_rabbitmq_outlasts_a_registration_job() -> None:
    """A registration job is acknowledged when it ends and may wait --worker-startup-timeout-secs for
    its worker: the broker's consumer timeout must be longer."""
    conf = (COMPOSE_DIR / "rabbitmq.conf").read_text()
    (timeout_ms,) = re.findall(r"^consumer_timeout\s*=\s*(\d+)$", conf, re.M)
    assert int(timeout_ms) > GatewayConfig().worker_startup_timeout_secs * 1000
    mount = compose()["services"]["rabbitmq"]["volumes"][0]
    assert mount.startswith("./rabbitmq.conf:/etc/rabbitmq/conf.d/")


# --- the image definition --------------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions, per stage: (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), rest.strip()))
    return stages


def copied_paths() -> list[str]:
    """What the build stage copies from the context (the runtime stage copies only from it)."""
    build, runtime = dockerfile_stages()
    sources: list[str] = []
    for instruction, rest in build:
        if instruction == "COPY":
            sources.append(rest.split()[0].rstrip("/"))
    assert all(rest.startswith("--from=build") for instruction, rest in runtime if instruction == "COPY")
    return sources


def test_the_image_is_non_root_small_and_runs_the_readme_command() -> None:
    build, runtime = dockerfile_stages()
    assert build[0][1].endswith("AS build")
    base = dict(runtime)["FROM"]
    assert base == "${PYTHON_IMAGE}"
    (arg,) = [line.split(" ", 1)[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("ARG ")]
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11-slim-\w+", arg), arg
    user = dict(runtime)["USER"]
    assert user.split(":")[0] not in ("0", "root")
    assert dict(runtime)["CMD"] == '["python", "manage.py", "rungateway"]'
    assert dict(runtime)["ENV"].count("GW_DATA_DIR=/data")
    sources = copied_paths()
    assert "requirements.txt" in sources and "fixtures" not in sources
    assert any("pip install" in rest and "requirements.txt" in rest for instruction, rest in build if instruction == "RUN")


def test_dockerignore_lets_in_exactly_what_is_copied() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*", "an allow-list: nothing reaches the build context unless listed"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert allowed == set(copied_paths())
    for source in copied_paths():
        assert (ROOT / source).exists(), source


def test_the_copied_tree_runs_the_gateway_commands(tmp_path: Path) -> None:
    """Copy exactly what the image copies and run its commands from there with this virtualenv: the
    gateway's command line, the Django checks, the Celery app, and the migration wait of the init
    containers (`migrate --check` fails on an unmigrated store and passes once migrate has run)."""
    app = tmp_path / "app"
    for source in copied_paths():
        if source == "requirements.txt":
            continue
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, app / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            app.mkdir(exist_ok=True)
            shutil.copy2(src, app / source)
    (tmp_path / "data").mkdir()  # the image's /data
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("GW_", "DJANGO_", "DATABASE_URL", "REDIS_URL", "CELERY_", "PROMETHEUS_", "PYTHON"))}
    env.update({"DJANGO_SETTINGS_MODULE": "gateway_project.settings", "GW_DATA_DIR": str(tmp_path / "data"),
                "DJANGO_SECRET_KEY": "kit-test"})

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *argv], cwd=app, env=env, capture_output=True, text=True, timeout=300)

    help_text = run("manage.py", "rungateway", "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "--shutdown-grace-period-secs" in help_text.stdout
    # In one process (each start costs seconds here): the ASGI app, the Celery app and the listeners
    # import from the copied tree alone; the checks pass; the init containers' wait holds on an
    # unmigrated store; the migration Job's command applies the migrations.
    script = """
import sys, django
django.setup()
import gateway_project.asgi, gateway_project.celery, administration.metrics_server
from django.core.management import call_command
origins = sorted({m.__file__.split("/app/")[0] for n, m in list(sys.modules.items())
                  if n.split(".")[0] in ("gateway_project", "inference", "administration", "common", "responses_api")
                  and getattr(m, "__file__", None)})
print("origins", origins)
call_command("check")
try:
    call_command("migrate", check=True, verbosity=0)
except SystemExit as exc:
    print("unmigrated exit", exc.code)
call_command("migrate", interactive=False, verbosity=0)
"""
    prepared = run("-c", script)
    assert prepared.returncode == 0, prepared.stderr
    assert f"origins {[str(tmp_path)]!r}" in prepared.stdout, "a module came from outside the copied tree"
    assert "unmigrated exit 1" in prepared.stdout
    waited = run("manage.py", "migrate", "--check")  # the init containers' command, now satisfied
    assert waited.returncode == 0, waited.stderr


def _container_engine() -> str | None:
    """Why no image can be built here, or None when a container engine answers."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker CLI on this machine"
    info = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return "no container engine reachable: " + " ".join((info.stderr or info.stdout).split())[:300]
    return None


def test_the_image_builds() -> None:
    reason = _container_engine()
    if reason:
        pytest.skip(reason)
    result = subprocess.run(["docker", "build", "-f", str(DOCKERFILE), "-t", "inference-gateway:kit-test", str(ROOT)],
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-4000:]
    user = subprocess.run(["docker", "image", "inspect", "--format", "{{.Config.User}}", "inference-gateway:kit-test"],
                          capture_output=True, text=True, timeout=60)
    assert user.stdout.strip() == "10001:10001"

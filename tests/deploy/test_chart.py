"""The Helm chart, rendered by Helm's Go engine (helm-python-sdk), for each mode and flag."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest
import yaml

from crd_schemas import BY_KIND as CRD_SCHEMAS
from deploy_support import CHART, DASHBOARD, NAMESPACE, RELEASE, REPO, by_kind, one, strip_meta

pytestmark = pytest.mark.unit

DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
S3_CHECKPOINT = {"pipeline": {"pipeline": {"id": "inv", "checkpoint": "s3a://lake/_checkpoints/inv"},
                             "storage": {"root": "s3a://lake/inv"}}}
SPARK_APP = {"statefulset": {"enabled": False}, "persistence": {"enabled": False},
             "sparkApplication": {"enabled": True}, **S3_CHECKPOINT}
SECRETS = {"secrets": {"kafkaSasl": {"existingSecret": "kafka-sasl"},
                       "kafkaTls": {"existingSecret": "kafka-ca", "certKey": "tls.crt", "keyKey": "tls.key"},
                       "objectStorage": {"existingSecret": "lake-s3"}}}
MONITORING = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}},
              "prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}


def merged(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        _deep_merge(out, copy.deepcopy(part))
    return out


def _deep_merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


EXAMPLES = {f"example-{p.stem}": yaml.safe_load(p.read_text()) for p in sorted((REPO / "deploy" / "examples").glob("*.yaml"))}

VALID_COMBINATIONS = {
    **EXAMPLES,
    "defaults": {},
    "monitoring-servicemonitor": MONITORING,
    "monitoring-podmonitor": {"metrics": {"podMonitor": {"enabled": True}, "service": {"enabled": False}},
                              "prometheusRule": {"enabled": True, "disabledAlerts": ["ChangelakeExpiredOffsetsSkipped"]}},
    "object-store-checkpoint-no-pvc": merged(S3_CHECKPOINT, {"persistence": {"enabled": False}}),
    "secrets": SECRETS,
    "on-delete-existing-serviceaccount": {"statefulset": {"updateStrategy": "OnDelete"},
                                          "serviceAccount": {"create": False, "name": "pipelines"}},
    "spark-application": SPARK_APP,
    "spark-application-spark-kafka": merged(SPARK_APP, {"pipeline": {"kafka": {"reader": "spark-kafka"}}}),
    "spark-application-all-flags": merged(SPARK_APP, SECRETS, MONITORING, {
        "sparkApplication": {"dynamicAllocation": {"enabled": True, "maxExecutors": 8}},
        "spark": {"conf": {"spark.sql.shuffle.partitions": "16"}}}),
    "extras": {"extraEnv": [{"name": "TZ", "value": "UTC"}],
               "extraVolumes": [{"name": "jaas", "secret": {"secretName": "jaas"}}],
               "extraVolumeMounts": [{"name": "jaas", "mountPath": "/etc/jaas"}],
               "imagePullSecrets": [{"name": "regcred"}], "commonLabels": {"team": "data"},
               "image": {"registry": "", "repository": "changelake", "tag": "dev"}},
}


@pytest.fixture(scope="module", params=sorted(VALID_COMBINATIONS))
def combination(request: pytest.FixtureRequest, render: Any) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    values = VALID_COMBINATIONS[request.param]
    return request.param, values, render(values)


# --- every valid combination -------------------------------------------------------------

def test_examples_are_rendered() -> None:
    assert len(EXAMPLES) >= 2


def test_renders_manifests_in_release_namespace(combination: Any) -> None:
    _, _, docs = combination
    assert docs, "nothing rendered"
    for doc in docs:
        assert doc["metadata"]["namespace"] == NAMESPACE, doc["__template__"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


@pytest.mark.parametrize("kube_version", ["1.27.0", "1.37.0"])
def test_builtin_kinds_validate_against_kubernetes_schemas(combination: Any, kube_version: str) -> None:
    import kubernetes_validate

    _, _, docs = combination
    checked = 0
    for doc in docs:
        if doc["kind"] in CRD_SCHEMAS:
            continue
        kubernetes_validate.validate(strip_meta(doc), kube_version, strict=True)
        checked += 1
    assert checked >= 3


def test_custom_resources_validate_against_their_schemas(combination: Any) -> None:
    import kubernetes_validate

    name, values, docs = combination
    for doc in docs:
        schema = CRD_SCHEMAS.get(doc["kind"])
        if schema is None:
            continue
        jsonschema.validate(strip_meta(doc), schema)
        if doc["kind"] == "SparkApplication":
            for role in ("driverSpec", "executorSpec"):
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{role.lower()}-template"},
                       "spec": doc["spec"][role]["podTemplateSpec"]["spec"]}
                kubernetes_validate.validate(pod, "1.31.0", strict=True)


def test_exactly_one_workload(combination: Any) -> None:
    _, values, docs = combination
    workloads = by_kind(docs, "StatefulSet") + by_kind(docs, "SparkApplication") + by_kind(docs, "Deployment")
    assert len(workloads) == 1
    expected = "SparkApplication" if values.get("sparkApplication", {}).get("enabled") else "StatefulSet"
    assert workloads[0]["kind"] == expected


def test_no_secret_values_rendered(combination: Any) -> None:
    _, _, docs = combination
    assert not by_kind(docs, "Secret"), "the chart must reference existing Secrets, never create them"


def test_pipeline_config_is_the_pipeline_value_with_metrics_port(combination: Any) -> None:
    _, values, docs = combination
    configmap = next(d for d in by_kind(docs, "ConfigMap") if "pipeline.yaml" in d["data"])
    rendered = yaml.safe_load(configmap["data"]["pipeline.yaml"])
    expected = copy.deepcopy(values.get("pipeline", DEFAULTS["pipeline"]))
    if "pipeline" not in values:
        expected = copy.deepcopy(DEFAULTS["pipeline"])
    else:
        expected = merged(DEFAULTS["pipeline"], values["pipeline"])
        if values["pipeline"].get("sources", DEFAULTS["pipeline"]["sources"]) != DEFAULTS["pipeline"]["sources"]:
            for section in ("tables", "views"):      # the example's, left out when the sources are the user's
                if section not in values["pipeline"]:
                    expected.pop(section, None)
    expected.setdefault("metrics", {})["port"] = values.get("metrics", {}).get("port", DEFAULTS["metrics"]["port"])
    if merged(DEFAULTS, values)["persistence"]["enabled"]:
        expected.setdefault("storage", {}).setdefault("root", "/var/lib/changelake/lake")
    assert rendered == expected


# --- StatefulSet mode ---------------------------------------------------------------------

def _statefulset(render: Any, values: dict[str, Any] | None = None) -> dict[str, Any]:
    return one(render(values or {}), "StatefulSet")


def _container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod_spec["containers"] if c["name"] == "changelake")


def test_statefulset_has_one_replica_and_never_overlaps(render: Any) -> None:
    sts = _statefulset(render)
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["podManagementPolicy"] == "OrderedReady"
    strategy = sts["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert "maxUnavailable" not in strategy.get("rollingUpdate", {})


def test_probes_hit_health_paths_on_the_metrics_port(render: Any) -> None:
    sts = _statefulset(render, {"metrics": {"port": 9200}})
    container = _container(sts["spec"]["template"]["spec"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == 9200
    for probe, path in (("livenessProbe", "/livez"), ("startupProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert get["port"] in ("metrics", 9200), probe
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CHANGELAKE_METRICS__PORT"] == "9200"


def _pipeline_yaml(docs: list[dict[str, Any]]) -> dict[str, Any]:
    configmap = next(d for d in by_kind(docs, "ConfigMap") if "pipeline.yaml" in d["data"])
    return yaml.safe_load(configmap["data"]["pipeline.yaml"])


ROUTED = {"pipeline": {
    "pipeline": {"id": "erp", "checkpoint": "/var/lib/changelake/checkpoints/erp"},
    "kafka": {"bootstrap_servers": "kafka:9092"},
    "sources": [{"name": "erp", "topic_pattern": "erp\\.public\\..*", "format": "debezium-json",
                 "route": [{"source_table": "public[.](.*)", "table": "$1"}]}]}}


def test_a_users_routed_pipeline_renders_without_the_example_tables(render: Any) -> None:
    # Helm merges the user's pipeline into values.yaml's example: its tables: [products] stayed, and
    # validate then said "table 'products' has no writer" (a crash loop).
    rendered = _pipeline_yaml(render(ROUTED))
    assert "tables" not in rendered and "views" not in rendered
    assert rendered["sources"] == ROUTED["pipeline"]["sources"]
    own_tables = merged(ROUTED, {"pipeline": {"tables": [{"name": "x", "primary_key": ["id"]}]}})
    assert _pipeline_yaml(render(own_tables))["tables"] == [{"name": "x", "primary_key": ["id"]}]
    # values that keep the example's sources keep its tables
    assert _pipeline_yaml(render({}))["tables"] == DEFAULTS["pipeline"]["tables"]


def test_the_charts_copy_of_the_example_pipeline_is_values_yamls() -> None:
    assert yaml.safe_load((CHART / "files" / "example-pipeline.yaml").read_text()) == DEFAULTS["pipeline"]


def test_storage_root_is_on_the_claim_or_required(render: Any, render_raw: Any, helm: Any) -> None:
    assert _pipeline_yaml(render({}))["storage"]["root"] == "/var/lib/changelake/lake"
    assert _pipeline_yaml(render(merged(ROUTED, {"persistence": {"mountPath": "/data"}, "pipeline": {
        "pipeline": {"checkpoint": "/data/cp"}}})))["storage"]["root"] == "/data/lake"
    given = merged(ROUTED, {"pipeline": {"storage": {"root": "s3a://lake/erp"}}})
    assert _pipeline_yaml(render(given))["storage"]["root"] == "s3a://lake/erp"
    with pytest.raises(helm.HelmRenderError) as raised:
        render_raw(merged(ROUTED, {"pipeline": {"storage": {"root": "./lake"}}}))
    assert "pipeline.storage.root \"./lake\" is a local path not below persistence.mountPath" in str(raised.value)
    with pytest.raises(helm.HelmRenderError) as raised:
        render_raw(merged(SPARK_APP, {"pipeline": {"storage": {"root": ""}}}))
    assert "pipeline.storage.root is required without persistence" in str(raised.value)


def test_scratch_space_has_size_limits(render: Any) -> None:
    for values, kind in (({}, "StatefulSet"), (SPARK_APP, "SparkApplication")):
        docs = render(merged(values, {"scratch": {"tmpSizeLimit": "3Gi", "sparkLocalSizeLimit": "20Gi"}}))
        workload = one(docs, kind)
        pods = ([workload["spec"]["template"]["spec"]] if kind == "StatefulSet" else
                [workload["spec"][s]["podTemplateSpec"]["spec"] for s in ("driverSpec", "executorSpec")])
        for pod in pods:
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = {m["mountPath"]: m["name"] for m in _container(pod)["volumeMounts"]}
            assert volumes[mounts["/tmp"]]["emptyDir"]["sizeLimit"] == "3Gi"
            assert volumes[mounts["/tmp/spark"]]["emptyDir"]["sizeLimit"] == "20Gi"
    # the StatefulSet's session writes under /tmp/spark in a directory of its own process, which the next start
    # deletes once the process is gone (changelake/spark/scratch.py): the volume outlives a killed container
    docs = render({})
    assert "spark.local.dir" not in one(docs, "ConfigMap")["data"]["spark-defaults.conf"]
    env = {e["name"]: e.get("value") for e in _container(one(docs, "StatefulSet")["spec"]["template"]["spec"])["env"]}
    assert env["CHANGELAKE_SCRATCH_DIR"] == "/tmp/spark"


def test_spark_application_pods_get_the_statefulsets_security_context(render: Any) -> None:
    app = one(render(SPARK_APP), "SparkApplication")
    for side in ("driverSpec", "executorSpec"):
        pod = app["spec"][side]["podTemplateSpec"]["spec"]
        assert pod["securityContext"] == DEFAULTS["statefulset"]["podSecurityContext"], side
        assert _container(pod)["securityContext"] == DEFAULTS["statefulset"]["securityContext"], side


def test_memory_limit_covers_the_measured_peak() -> None:
    # docs/operations.md "Memory": 6.9 GB peak measured on 2 cores; the default limit must hold it
    limit = DEFAULTS["resources"]["limits"]["memory"]
    assert limit.endswith("Gi") and int(limit[:-2]) * 2**30 > 6.9e9


def test_graceful_shutdown_window(render: Any) -> None:
    sts = _statefulset(render, {"statefulset": {"terminationGracePeriodSeconds": 300}})
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 300


def test_runs_the_pipeline_file_mounted_from_the_configmap(render: Any) -> None:
    sts = _statefulset(render)
    pod = sts["spec"]["template"]["spec"]
    container = _container(pod)
    config_path = container["args"][container["args"].index("-c") + 1]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == config_path)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == f"{RELEASE}-changelake"
    assert mount["subPath"] in {item["path"] for item in volume["configMap"]["items"]}


def test_checkpoint_lives_on_the_claim(render: Any) -> None:
    sts = _statefulset(render)
    container = _container(sts["spec"]["template"]["spec"])
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    data_mount = next(m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    checkpoint = DEFAULTS["pipeline"]["pipeline"]["checkpoint"]
    assert checkpoint.startswith(data_mount["mountPath"].rstrip("/") + "/")
    assert claim["spec"]["resources"]["requests"]["storage"] == DEFAULTS["persistence"]["size"]


def test_memory_settings_reach_spark(render: Any) -> None:
    docs = render({"spark": {"driver": {"memory": "3g"}, "executor": {"pysparkMemory": "768m"},
                             "conf": {"spark.sql.shuffle.partitions": 8}}})
    container = _container(one(docs, "StatefulSet")["spec"]["template"]["spec"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SPARK_DRIVER_MEMORY"] == "3g"
    conf_dir = env["SPARK_CONF_DIR"]
    defaults = next(d for d in by_kind(docs, "ConfigMap") if "spark-defaults.conf" in d["data"])
    lines = dict(line.split(" ", 1) for line in defaults["data"]["spark-defaults.conf"].splitlines() if line)
    assert lines["spark.driver.memory"] == "3g"
    assert lines["spark.executor.pyspark.memory"] == "768m"
    assert lines["spark.sql.shuffle.partitions"] == "8"
    assert any(m["mountPath"] == conf_dir for m in container["volumeMounts"])


def test_secret_references(render: Any) -> None:
    container = _container(_statefulset(render, SECRETS)["spec"]["template"]["spec"])
    env = {e["name"]: e for e in container["env"]}
    ref = env["CHANGELAKE_KAFKA__PROPERTIES__SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "kafka-sasl", "key": "password"}
    assert env["CHANGELAKE_KAFKA__PROPERTIES__SSL_CA_LOCATION"]["value"] == "/etc/changelake/kafka-tls/ca.crt"
    assert env["CHANGELAKE_KAFKA__PROPERTIES__SSL_KEY_LOCATION"]["value"] == "/etc/changelake/kafka-tls/tls.key"
    assert container["envFrom"] == [{"secretRef": {"name": "lake-s3"}}]
    assert any(m["mountPath"] == "/etc/changelake/kafka-tls" and m["readOnly"] for m in container["volumeMounts"])
    plain = _container(_statefulset(render)["spec"]["template"]["spec"])
    assert not any(e["name"].startswith("CHANGELAKE_KAFKA__PROPERTIES__SASL") for e in plain["env"])
    assert "envFrom" not in plain


def test_image_defaults_to_app_version(render: Any) -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    container = _container(_statefulset(render)["spec"]["template"]["spec"])
    assert container["image"] == f"ghcr.io/changelake/changelake:{app_version}"
    container = _container(_statefulset(render, {"image": {"tag": "1.2.3", "registry": "r.example"}})["spec"]["template"]["spec"])
    assert container["image"] == "r.example/changelake/changelake:1.2.3"


def test_config_change_rolls_the_pod(render: Any) -> None:
    a = _statefulset(render)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    b = _statefulset(render, {"pipeline": {"pipeline": {"trigger_interval": "30 seconds"}}})["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert a != b


# --- metrics plumbing -----------------------------------------------------------------------

def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_metrics_service_selects_the_pipeline_pod(render: Any) -> None:
    docs = render(MONITORING)
    pod_labels = one(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    metrics = services[f"{RELEASE}-changelake-metrics"]
    assert _matches(metrics["spec"]["selector"], pod_labels)
    assert metrics["spec"]["ports"][0]["port"] == DEFAULTS["metrics"]["port"]
    monitor = one(docs, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped = [name for name, svc in services.items() if _matches(selector, svc["metadata"]["labels"])]
    assert scraped == [f"{RELEASE}-changelake-metrics"], "each target must be scraped through one Service only"
    assert monitor["metadata"]["labels"]["release"] == "kps"


def test_podmonitor_selects_the_pipeline_pod(render: Any) -> None:
    docs = render({"metrics": {"podMonitor": {"enabled": True}}})
    pod_labels = one(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    monitor = one(docs, "PodMonitor")
    assert _matches(monitor["spec"]["selector"]["matchLabels"], pod_labels)
    relabel = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_changelake_io_pipeline"], "targetLabel": "pipeline"} in relabel
    assert pod_labels["changelake.io/pipeline"] == DEFAULTS["pipeline"]["pipeline"]["id"]


def test_monitoring_resources_only_behind_flags(render: Any) -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule", "SparkApplication"}
    assert not [d for d in render() if d["kind"] == "ConfigMap" and "changelake.json" in d.get("data", {})]


def test_grafana_dashboard_configmap(render: Any) -> None:
    docs = render({"grafanaDashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "CDC"}}})
    cm = next(d for d in by_kind(docs, "ConfigMap") if "changelake.json" in d["data"])
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "CDC"}
    assert json.loads(cm["data"]["changelake.json"]) == json.loads(DASHBOARD.read_text())


# --- SparkApplication mode ------------------------------------------------------------------

def test_spark_application(render: Any) -> None:
    docs = render(merged(SPARK_APP, {"sparkApplication": {"executor": {"instances": 3, "pysparkMemory": "2g"}}}))
    assert not by_kind(docs, "StatefulSet") and not by_kind(docs, "PersistentVolumeClaim")
    app = one(docs, "SparkApplication")
    assert app["apiVersion"] == "spark.apache.org/v1"
    conf = app["spec"]["sparkConf"]
    assert conf["spark.executor.instances"] == "3"
    assert conf["spark.executor.pyspark.memory"] == "2g"
    assert conf["spark.kubernetes.container.image"].endswith(":0.1.0-spark")
    assert app["spec"]["driverArgs"] == ["run", "-c", "/etc/changelake/pipeline.yaml"]
    assert app["spec"]["applicationTolerations"]["restartConfig"]["restartPolicy"] == "Always"
    driver = app["spec"]["driverSpec"]["podTemplateSpec"]
    container = _container(driver["spec"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    # The metrics Service must reach the driver, not the executors.
    service = next(s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics"))
    assert _matches(service["spec"]["selector"], driver["metadata"]["labels"])
    assert not _matches(service["spec"]["selector"], app["spec"]["executorSpec"]["podTemplateSpec"]["metadata"]["labels"])
    # The driver's ServiceAccount may create executor pods.
    binding = one(docs, "RoleBinding")
    role = one(docs, "Role")
    assert binding["subjects"][0]["name"] == conf["spark.kubernetes.authenticate.driver.serviceAccountName"]
    assert any("pods" in r["resources"] and "create" in r["verbs"] for r in role["rules"])


def test_spark_application_lists_the_images_pinned_spark_kafka_jars(render: Any) -> None:
    """kafka.reader spark-kafka: spec.jars (the operator's spark.jars) names every jar of the image's spark-kafka
    set, as jvm/jvm.lock pins it, at the path the image installs it to; the python reader needs none."""
    from changelake import jvm_deps

    _, locked = jvm_deps.read_lock()
    app = one(render(merged(SPARK_APP, {"pipeline": {"kafka": {"reader": "spark-kafka"}}})), "SparkApplication")
    jars = app["spec"]["jars"].split(",")
    assert sorted(jars) == sorted(f"local://{jvm_deps.IMAGE_HOME}/spark-kafka/{j}" for j in locked["spark-kafka"])
    assert any("/spark-sql-kafka-0-10_2.13-" in j for j in jars)
    assert "jars" not in one(render(SPARK_APP), "SparkApplication")["spec"]


def test_the_charts_jar_list_is_the_lock() -> None:
    """helm/changelake/files/jvm-jars.yaml is written from jvm/jvm.lock (python -m changelake.jvm_deps chart)."""
    from changelake import jvm_deps

    assert (CHART / "files" / "jvm-jars.yaml").read_text() == jvm_deps.chart_jars_text(), \
        "run `python -m changelake.jvm_deps chart` after a change of jvm/jvm.lock"


def test_spark_application_uses_only_the_operators_crd_fields(combination: Any) -> None:
    """Every field the chart writes in a SparkApplication's spec exists in the operator's own CRD (v1), with the
    CRD's type; so does the hand-written schema's every field."""
    from crd_schemas import SPARK_APPLICATION, SPARK_OPERATOR_V1_NESTED, SPARK_OPERATOR_V1_SPEC_FIELDS

    types = {"object": dict, "array": list, "string": str}
    declared = SPARK_APPLICATION["properties"]["spec"]["properties"]
    assert set(declared) <= set(SPARK_OPERATOR_V1_SPEC_FIELDS)
    for name, schema in declared.items():
        assert schema.get("type", SPARK_OPERATOR_V1_SPEC_FIELDS[name]) == SPARK_OPERATOR_V1_SPEC_FIELDS[name], name
    _, _, docs = combination
    for app in by_kind(docs, "SparkApplication"):
        spec = app["spec"]
        for name, value in spec.items():
            assert isinstance(value, types[SPARK_OPERATOR_V1_SPEC_FIELDS[name]]), name
        for path, fields in SPARK_OPERATOR_V1_NESTED.items():
            node = spec
            for part in path:
                node = node.get(part, {})
            assert set(node) <= fields, (path, set(node) - fields)


def test_spark_application_dynamic_allocation(render: Any) -> None:
    app = one(render(merged(SPARK_APP, {"sparkApplication": {"dynamicAllocation": {"enabled": True, "maxExecutors": 6}}})), "SparkApplication")
    conf = app["spec"]["sparkConf"]
    assert conf["spark.dynamicAllocation.enabled"] == "true"
    assert conf["spark.dynamicAllocation.maxExecutors"] == "6"
    assert "spark.executor.instances" not in conf


# --- fail guards ----------------------------------------------------------------------------

INVALID = {
    "both-modes": ({"sparkApplication": {"enabled": True}, **S3_CHECKPOINT, "persistence": {"enabled": False}},
                   "statefulset.enabled and sparkApplication.enabled are both true"),
    "no-mode": ({"statefulset": {"enabled": False}}, "neither statefulset.enabled nor sparkApplication.enabled"),
    "two-replicas": ({"statefulset": {"replicas": 2}}, "statefulset.replicas is 2: it must be 1"),
    "zero-replicas": ({"statefulset": {"replicas": 0}}, "statefulset.replicas is 0: it must be 1"),
    "local-checkpoint-without-pvc": ({"persistence": {"enabled": False}},
                                     "persistence.enabled is false but pipeline.pipeline.checkpoint \"/var/lib/changelake/checkpoints\" is a local path"),
    "checkpoint-outside-volume": ({"pipeline": {"pipeline": {"checkpoint": "/tmp/checkpoints"}}},
                                  "is not below persistence.mountPath"),
    "spark-application-local-checkpoint": ({"statefulset": {"enabled": False}, "persistence": {"enabled": False},
                                            "sparkApplication": {"enabled": True}},
                                           "is a local path, but sparkApplication mode has no volume"),
    "spark-application-with-pvc": (merged(SPARK_APP, {"persistence": {"enabled": True}}),
                                   "persistence.enabled applies to the StatefulSet only"),
    "spark-application-without-serviceaccount": (merged(SPARK_APP, {"serviceAccount": {"create": False}}),
                                                 "sparkApplication mode needs a ServiceAccount"),
    "two-monitors": ({"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
                     "scraped twice"),
    "servicemonitor-without-service": ({"metrics": {"serviceMonitor": {"enabled": True}, "service": {"enabled": False}}},
                                       "metrics.serviceMonitor.enabled needs metrics.service.enabled=true"),
    "metrics-port-mismatch": ({"pipeline": {"metrics": {"port": 9999}}}, "pipeline.metrics.port (9999) differs from metrics.port (9108)"),
    "unknown-alert-override": ({"prometheusRule": {"enabled": True, "overrides": {"NoSuchAlert": {"for": "5m"}}}},
                               "prometheusRule.overrides names \"NoSuchAlert\""),
    "unknown-disabled-alert": ({"prometheusRule": {"disabledAlerts": ["NoSuchAlert"]}},
                               "prometheusRule.disabledAlerts names \"NoSuchAlert\""),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_fail_guards(case: str, render_raw: Any, helm: Any) -> None:
    values, message = INVALID[case]
    with pytest.raises(helm.HelmRenderError) as raised:
        render_raw(values)
    assert message in str(raised.value)


@pytest.mark.parametrize("values, where", [
    ({"statefulset": {"replicas": "one"}}, "/statefulset/replicas"),
    ({"spark": {"driver": {"memory": "lots"}}}, "/spark/driver/memory"),
    ({"spark": {"conf": {"sql.shuffle.partitions": "8"}}}, "invalid propertyName 'sql.shuffle.partitions'"),
    ({"pipeline": {"pipeline": {"id": ""}}}, "/pipeline/pipeline/id"),
    ({"metrics": {"port": 70000}}, "/metrics/port"),
    ({"sparkApplication": {"restartPolicy": "Sometimes"}}, "/sparkApplication/restartPolicy"),
    ({"imagePullSecret": [{"name": "typo"}]}, "additional properties 'imagePullSecret'"),
    # the pipeline subtree is checked against the config model's JSON schema (config_reference.py)
    ({"pipeline": {"sources": [{"name": "p", "topics": ["t"], "format": "bogus", "table": "products"}]}},
     "/pipeline/sources/0/format"),
    ({"pipeline": {"pipeline": {"trigger_intervall": "1 second"}}}, "additional properties 'trigger_intervall'"),
    ({"pipeline": {"pipeline": {"max_records_per_batch": "many"}}}, "/pipeline/pipeline/max_records_per_batch"),
    ({"pipeline": {"tables": [{"name": "products", "primary_key": [], "from": "x"}]}},
     "/pipeline/tables/0/primary_key"),
])
def test_values_schema_rejects(values: dict[str, Any], where: str, render_raw: Any, helm: Any) -> None:
    with pytest.raises(helm.HelmValuesError) as raised:
        render_raw(values)
    assert where in str(raised.value)


def test_values_schema_accepts_defaults(chart: Any) -> None:
    chart.validate_schema(DEFAULTS)


def test_values_schema_accepts_env_references_and_secret_files(render_raw: Any) -> None:
    render_raw({"pipeline": {"pipeline": {"max_records_per_batch": "${BATCH:-5000}"},
                             "kafka": {"properties": {"sasl.password_file": "/run/secrets/kafka"}}}})


def test_helm_lint_rejects_a_broken_pipeline(helm: Any) -> None:
    report = helm.lint(str(CHART), {"pipeline": {"sources": [{"name": "p", "topics": ["t"], "formatt": "x",
                                                              "table": "products"}]}}, strict=True)
    assert any("formatt" in e for e in _lint_errors(report)), report


# --- helm lint ------------------------------------------------------------------------------

def _lint_errors(report: dict[str, Any]) -> list[str]:
    return [m["error"] for m in report["messages"] if m["severity"] >= 2] + list(report["errors"])


@pytest.mark.parametrize("values", [{}, SPARK_APP, MONITORING], ids=["defaults", "spark-application", "monitoring"])
def test_helm_lint_strict_passes(helm: Any, values: dict[str, Any]) -> None:
    report = helm.lint(str(CHART), values, strict=True, kube_version="v1.31.0")
    assert report["total_charts_linted"] == 1
    assert _lint_errors(report) == []


def test_helm_lint_reports_a_broken_template(helm: Any, tmp_path: Any) -> None:
    import shutil

    copy_dir = tmp_path / "changelake"
    shutil.copytree(CHART, copy_dir)
    (copy_dir / "templates" / "broken.yaml").write_text("{{ .Values.metrics.nothere.port }}\n")
    assert _lint_errors(helm.lint(str(copy_dir), strict=True))


def test_notes_name_the_workload(render_raw: Any) -> None:
    notes = render_raw({})["changelake/templates/NOTES.txt"]
    assert f"statefulset/{RELEASE}-changelake" in notes
    assert "Spark: master local[2], driver heap 2g" in notes and "WARNING" not in notes
    notes = render_raw(SPARK_APP)["changelake/templates/NOTES.txt"]
    assert f"sparkapp {RELEASE}-changelake" in notes
    assert "Spark: 2 executor(s) x 2 core(s), 4g heap each; driver heap 2g" in notes
    notes = render_raw({"pipeline": {"pipeline": {"master": "local[8]"}}})["changelake/templates/NOTES.txt"]
    assert "WARNING: pipeline.pipeline.master (local[8]) has no effect" in notes


def test_statefulset_spark_values_are_what_the_session_gets(render: Any, tmp_path: Any) -> None:
    # deploy/examples/statefulset-values.yaml asks for local[4], a 4g heap and 8 shuffle partitions: the
    # rendered spark-defaults.conf and SPARK_DRIVER_MEMORY, read as Spark's launcher reads them, win
    # over the code's defaults (local[2], 2g, one partition per core)
    from changelake.service.config import parse_config
    from changelake.spark.session import launcher_settings, session_settings

    values = EXAMPLES["example-statefulset-values"]
    docs = render(values)
    container = _container(one(docs, "StatefulSet")["spec"]["template"]["spec"])
    env = {e["name"]: e.get("value") for e in container["env"] if "value" in e}
    config_map = next(d for d in by_kind(docs, "ConfigMap") if "spark-defaults.conf" in d["data"])
    (tmp_path / "spark-defaults.conf").write_text(config_map["data"]["spark-defaults.conf"])
    launcher = launcher_settings({"SPARK_CONF_DIR": str(tmp_path), "SPARK_DRIVER_MEMORY": env["SPARK_DRIVER_MEMORY"]})
    pipeline = parse_config(config_map["data"]["pipeline.yaml"], environ={}).pipeline
    settings = session_settings(master=pipeline.master, conf=pipeline.spark_conf, launcher=launcher)
    assert settings.master == "local[4]"
    assert launcher["spark.driver.memory"] == "4g" and "spark.driver.memory" not in settings.conf
    assert launcher["spark.sql.shuffle.partitions"] == "8" and "spark.sql.shuffle.partitions" not in settings.conf


def test_sparkapplication_spark_conf_is_what_the_session_gets(render: Any) -> None:
    # the operator passes sparkConf to spark-submit, whose JVM properties are the launcher's settings:
    # the pipeline's own settings and the code's defaults give way to them
    from changelake.spark.session import session_settings

    values = EXAMPLES["example-sparkapplication-values"]
    app = one(render(values), "SparkApplication")
    launcher = {k: str(v) for k, v in app["spec"]["sparkConf"].items()}
    launcher["spark.master"] = "k8s://https://kubernetes.default.svc"      # what the operator submits with
    settings = session_settings(master="local[2]", conf={"spark.executor.memory": "1g"}, launcher=launcher)
    assert settings.master == "k8s://https://kubernetes.default.svc"
    assert launcher["spark.executor.instances"] == "4" and launcher["spark.executor.memory"] == "4g"
    assert not {"spark.driver.memory", "spark.executor.memory", "spark.master"} & set(settings.conf)
    assert set(settings.overridden) == {"spark.master", "spark.executor.memory"}

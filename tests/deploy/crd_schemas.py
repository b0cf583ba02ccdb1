"""Minimal JSON schemas for the custom resources the chart renders.

kubernetes-validate bundles schemas for built-in kinds only. For the
prometheus-operator kinds (ServiceMonitor, PodMonitor, PrometheusRule) and the
Apache Spark Kubernetes Operator's SparkApplication (spark.apache.org/v1)
these hand-written schemas check what the chart writes: the required fields,
their types, and that no unknown field appears at the levels the chart
controls. They follow the operators' documented APIs but are NOT the
operators' full CRD schemas; installing the CRDs in a cluster is the complete
check.
"""

from __future__ import annotations

from typing import Any

_STR = {"type": "string"}
_STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_META = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                   "namespace": _STR, "labels": _STRMAP, "annotations": _STRMAP},
}
_RELABEL = {
    "type": "object", "additionalProperties": False,
    "properties": {"sourceLabels": {"type": "array", "items": _STR}, "targetLabel": _STR,
                   "action": _STR, "regex": _STR, "replacement": _STR, "separator": _STR},
}
_ENDPOINT = {
    "type": "object", "additionalProperties": False, "required": ["port"],
    "properties": {"port": _STR, "path": _STR, "interval": _DURATION, "scrapeTimeout": _DURATION,
                   "relabelings": {"type": "array", "items": _RELABEL}},
}
_SELECTOR = {"type": "object", "required": ["matchLabels"], "properties": {"matchLabels": _STRMAP}}
_NS_SELECTOR = {"type": "object", "properties": {"matchNames": {"type": "array", "items": _STR}, "any": {"type": "boolean"}}}


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {"apiVersion": {"const": api_version}, "kind": {"const": kind},
                       "metadata": _META, "spec": spec},
    }


SERVICE_MONITOR = _resource("monitoring.coreos.com/v1", "ServiceMonitor", {
    "type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
    "properties": {"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR,
                   "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT}},
})

POD_MONITOR = _resource("monitoring.coreos.com/v1", "PodMonitor", {
    "type": "object", "additionalProperties": False, "required": ["selector", "podMetricsEndpoints"],
    "properties": {"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR,
                   "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT}},
})

PROMETHEUS_RULE = _resource("monitoring.coreos.com/v1", "PrometheusRule", {
    "type": "object", "additionalProperties": False, "required": ["groups"],
    "properties": {"groups": {"type": "array", "minItems": 1, "items": {
        "type": "object", "additionalProperties": False, "required": ["name", "rules"],
        "properties": {"name": _STR, "interval": _DURATION, "rules": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "required": ["expr"],
            "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
            "properties": {"alert": _STR, "record": _STR, "expr": _STR, "for": _DURATION,
                           "labels": _STRMAP, "annotations": _STRMAP}}}}}}},
})

_POD_TEMPLATE = {
    "type": "object", "additionalProperties": False,
    "properties": {"podTemplateSpec": {"type": "object", "required": ["spec"], "properties": {
        "metadata": {"type": "object", "properties": {"labels": _STRMAP, "annotations": _STRMAP}},
        "spec": {"type": "object", "required": ["containers"], "properties": {
            "containers": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["name"], "properties": {"name": {"const": "changelake"}}}}}}}}},
}

#: The Apache Spark Kubernetes Operator's own CRD, ``spec`` of ``sparkapplications.spark.apache.org`` version v1
#: (build-tools/helm/spark-kubernetes-operator/crds/sparkapplications.spark.apache.org-v1.yaml of
#: apache/spark-kubernetes-operator at d5acafd): every field with its type. :data:`SPARK_APPLICATION` may only
#: use these, with these types (tests/deploy/test_chart.py checks it).
SPARK_OPERATOR_V1_SPEC_FIELDS = {
    "applicationTolerations": "object", "configMapSpecs": "array", "deploymentMode": "string", "driverArgs": "array",
    "driverGrpcRouteList": "array", "driverHttpRouteList": "array", "driverServiceIngressList": "array",
    "driverSpec": "object", "executorSpec": "object", "files": "string", "jars": "string", "mainClass": "string",
    "proxyUser": "string", "pyFiles": "string", "runtimeVersions": "object", "sparkConf": "object",
    "sparkRFiles": "string",
}
#: the same CRD's nested fields the chart writes: path -> the fields there
SPARK_OPERATOR_V1_NESTED = {
    ("runtimeVersions",): {"jdkVersion", "scalaVersion", "sparkVersion"},
    ("applicationTolerations",): {"applicationTimeoutConfig", "instanceConfig", "resourceRetainDurationMillis",
                                  "resourceRetainPolicy", "restartConfig", "ttlAfterStopMillis"},
    ("applicationTolerations", "restartConfig"): {
        "maxRestartAttempts", "maxRestartOnFailure", "maxRestartOnSchedulingFailure", "restartBackoffMillis",
        "restartBackoffMillisForFailure", "restartBackoffMillisForSchedulingFailure", "restartCounterResetMillis",
        "restartPolicy"},
    ("driverSpec",): {"podTemplateSpec"},
    ("executorSpec",): {"podTemplateSpec"},
}

SPARK_APPLICATION = _resource("spark.apache.org/v1", "SparkApplication", {
    "type": "object", "additionalProperties": False,
    "required": ["runtimeVersions", "sparkConf"],
    "anyOf": [{"required": ["pyFiles"]}, {"required": ["mainClass"]}],
    "properties": {
        "pyFiles": {"type": "string", "pattern": "^local://"},
        "mainClass": _STR,
        # comma-separated, as spark.jars (the operator hands it to spark-submit); local:// = a path in the image
        "jars": {"type": "string", "pattern": r"^local://[^,]+\.jar(,local://[^,]+\.jar)*$"},
        "driverArgs": {"type": "array", "items": _STR},
        "runtimeVersions": {"type": "object", "required": ["sparkVersion"], "additionalProperties": False,
                            "properties": {"sparkVersion": _STR, "scalaVersion": _STR}},
        "sparkConf": {"type": "object", "required": ["spark.kubernetes.container.image"],
                      "propertyNames": {"pattern": r"^spark\."}, "additionalProperties": {"type": "string"}},
        "applicationTolerations": {"type": "object", "additionalProperties": False, "properties": {
            "restartConfig": {"type": "object", "additionalProperties": False, "properties": {
                "restartPolicy": {"enum": ["Never", "Always", "OnFailure", "OnInfrastructureFailure"]},
                "maxRestartAttempts": {"type": "integer", "minimum": 0},
                "restartBackoffMillis": {"type": "integer", "minimum": 0}}},
            "resourceRetainPolicy": _STR}},
        "driverSpec": _POD_TEMPLATE,
        "executorSpec": _POD_TEMPLATE,
    },
})

BY_KIND = {
    "ServiceMonitor": SERVICE_MONITOR,
    "PodMonitor": POD_MONITOR,
    "PrometheusRule": PROMETHEUS_RULE,
    "SparkApplication": SPARK_APPLICATION,
}

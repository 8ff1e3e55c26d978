#!/usr/bin/python3
"""Offline checks of deploy/k8s and deploy/k8s/sharded: no cluster, nothing
downloaded.

Every manifest parses (duplicate keys refused) and every field is checked
against the Kubernetes API types of python3-kubernetes (unknown fields,
wrong types, missing required fields). Debian 12's python3-kubernetes 22.6
is the Kubernetes 1.22 API: the few types used here that are newer
(Probe.grpc, Kubernetes 1.24; autoscaling/v2, 1.23, whose fields are those
of v2beta2; topologySpreadConstraints' matchLabelKeys, 1.27) and the
Prometheus Operator's ServiceMonitor are described in EXTRA_TYPES and
EXTRA_FIELDS below. Then the manifests are checked against each other and
against knnd's config in their ConfigMaps, parsed with the config.proto
schema. Every knnd workload (deploy/k8s's Deployment; the sharded layout's
shard StatefulSets and front Deployment): ports (the HTTP API's too, and its
file variant with the "#http: " lines taken in), probes (gRPC, or httpGet
on the HTTP API's health routes), memory limit with
requests == limits, read-only index, drain timing, security context,
selectors, scrape annotations. deploy/k8s: the kustomization's resource
list, and that metrics are scraped by exactly one route (the pods'
prometheus.io/* annotations, the default, or the opt-in ServiceMonitor),
never both. deploy/k8s/sharded (docs/sharding.md): replica groups of equal
size and template, --index from $(POD_INDEX) defined by the pod-index label,
keep_previous_versions >= 1, one headless Service and one budget per shard
selecting exactly that shard's replicas across the groups, and the front's
shard_targets naming exactly those Services with the kustomization's
namespace and the shards' port.

  manifests_test.py --source-dir . [unittest args]
"""
import argparse
import copy
import functools
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import kubernetes.client as k8s
import yaml

ARGS = None

# Types the models lack, in the models' notation: (fields, required).
EXTRA_TYPES = {
    "GRPCAction": ({"port": "int", "service": "str"}, {"port"}),
    "ServiceMonitor": ({"apiVersion": "str", "kind": "str",
                        "metadata": "V1ObjectMeta", "spec": "ServiceMonitorSpec"},
                       {"spec"}),
    "ServiceMonitorSpec": ({"selector": "V1LabelSelector",
                            "endpoints": "list[ServiceMonitorEndpoint]",
                            "namespaceSelector": "NamespaceSelector",
                            "jobLabel": "str", "targetLabels": "list[str]",
                            "podTargetLabels": "list[str]", "sampleLimit": "int"},
                           {"selector", "endpoints"}),
    "ServiceMonitorEndpoint": ({"port": "str", "targetPort": "object",
                                "path": "str", "scheme": "str", "interval": "str",
                                "scrapeTimeout": "str", "honorLabels": "bool",
                                "relabelings": "list[object]",
                                "metricRelabelings": "list[object]"}, set()),
    "NamespaceSelector": ({"any": "bool", "matchNames": "list[str]"}, set()),
    "Kustomization": ({"apiVersion": "str", "kind": "str",
                       "resources": "list[str]", "images": "list[object]",
                       "labels": "list[object]", "namespace": "str",
                       "patches": "list[object]"},
                      {"resources"}),
}
# Fields added to a model's type after Kubernetes 1.22.
EXTRA_FIELDS = {"V1Probe": {"grpc": "GRPCAction"},
                "V1TopologySpreadConstraint": {"matchLabelKeys": "list[str]"}}
KINDS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2beta2HorizontalPodAutoscaler",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "ServiceMonitor",
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"): "Kustomization",
}
PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float),
              "datetime": str, "date": str}
HEALTH_SERVICES = ("", "knnd.v1.KnnService")
# The HTTP API's probe routes (docs/api.md, "HTTP/JSON"): /healthz/ready
# answers for knnd.v1.KnnService (startup and readiness), /healthz/live for
# "" (liveness).
HTTP_PROBE_PATHS = {"startupProbe": "/healthz/ready",
                    "readinessProbe": "/healthz/ready",
                    "livenessProbe": "/healthz/live"}
MIN_STARTUP_SECONDS = 300
# Files of deploy/k8s that the default kustomization leaves out on purpose:
# the ServiceMonitor is the opt-in second scrape route (kustomization.yaml).
OPTIONAL_RESOURCES = {"servicemonitor.yaml"}
PROMETHEUS_ANNOTATION_PREFIX = "prometheus.io/"
PROCESS_BASELINE_BYTES = 100 << 20
# After the drain knnd closes its listeners (GOAWAY, held answers) in about
# a second; the grace period leaves room for it.
CLOSE_MARGIN_S = 2
# The label a StatefulSet's controller gives each pod, its ordinal
# (Kubernetes >= 1.28): a shard server's shard number.
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
POD_INDEX_FIELD = f"metadata.labels['{POD_INDEX_LABEL}']"
# The front's target for one shard: its headless Service's cluster DNS name.
SHARD_TARGET = re.compile(r"dns:///(?P<service>[a-z0-9][-a-z0-9]*)\."
                          r"(?P<namespace>[a-z0-9][-a-z0-9]*)\.svc\.cluster\.local:"
                          r"(?P<port>\d+)")


class UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys (PyYAML keeps the last)."""


def _mapping(loader, node, deep=False):
    keys = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in keys:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        keys.add(key)
    return loader.construct_mapping(node, deep)


UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_dir(directory, uncomment=()):
    """{file name: [documents]} of every .yaml file in `directory`, with the
    lines commented out as "#MARK: " for each MARK of `uncomment` taken in
    (the files' documented variants: "http" turns the HTTP API on)."""
    docs = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(directory, name)) as f:
                text = f.read()
            for mark in uncomment:
                text = text.replace(f"#{mark}: ", "")
            docs[name] = [d for d in yaml.load_all(text, UniqueKeyLoader) if d]
    return docs


def commented_block(directory, name, mark):
    """The YAML of the lines of file `name` commented out as "#MARK: ",
    parsed (a variant that replaces keys rather than adds them)."""
    with open(os.path.join(directory, name)) as f:
        lines = [line.split(f"#{mark}: ", 1)[1] for line in f
                 if f"#{mark}: " in line]
    return yaml.load("".join(lines), UniqueKeyLoader)


@functools.lru_cache(maxsize=None)
def fields_of(type_name):
    """(json field -> type, required json fields) of an API type."""
    if type_name in EXTRA_TYPES:
        return EXTRA_TYPES[type_name]
    cls = getattr(k8s, type_name)
    fields = {cls.attribute_map[a]: t for a, t in cls.openapi_types.items()}
    fields.update(EXTRA_FIELDS.get(type_name, {}))
    # The models' setters refuse None for required fields.
    probe = cls.__new__(cls)
    probe.local_vars_configuration = k8s.Configuration()
    required = set()
    for attr in cls.openapi_types:
        try:
            setattr(probe, attr, None)
        except ValueError:
            required.add(cls.attribute_map[attr])
    return fields, required


def check_type(value, type_name, path, errors):
    if type_name == "object":
        return
    if m := re.fullmatch(r"list\[(.+)\]", type_name):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {value!r}")
            return
        for i, item in enumerate(value):
            check_type(item, m[1], f"{path}[{i}]", errors)
        return
    if m := re.fullmatch(r"dict\(str, (.+)\)", type_name):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map, got {value!r}")
            return
        for key, item in value.items():
            check_type(item, m[1], f"{path}.{key}", errors)
        return
    if type_name in PRIMITIVES:
        if not isinstance(value, PRIMITIVES[type_name]) or (
                type_name == "int" and isinstance(value, bool)):
            errors.append(f"{path}: expected {type_name}, got {value!r}")
        return
    if not isinstance(value, dict):
        errors.append(f"{path}: expected a {type_name} object, got {value!r}")
        return
    fields, required = fields_of(type_name)
    for key, item in value.items():
        if key not in fields:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
        else:
            check_type(item, fields[key], f"{path}.{key}", errors)
    for key in sorted(required - value.keys()):
        errors.append(f"{path}: {type_name} requires {key}")


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def memory_bytes(quantity):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "": 1}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?|k|)", str(quantity))
    if not m:
        raise ValueError(f"memory quantity {quantity!r}")
    return int(float(m[1]) * units[m[2]])


def cpu_millis(quantity):
    text = str(quantity)
    return int(text[:-1]) if text.endswith("m") else round(float(text) * 1000)


def parse_objects(docs):
    """({kind: [(file, document)]}, schema errors) of `docs`."""
    errors = []
    objects = {}
    for name, file_docs in docs.items():
        for i, doc in enumerate(file_docs):
            where = f"{name}[{i}]"
            if not isinstance(doc, dict):
                errors.append(f"{where}: not a mapping")
                continue
            kind = (doc.get("apiVersion"), doc.get("kind"))
            if kind not in KINDS:
                errors.append(f"{where}: unexpected apiVersion/kind {kind}")
                continue
            check_type(doc, KINDS[kind], f"{where} {kind[1]}", errors)
            if kind[1] != "Kustomization" and not doc.get("metadata", {}).get("name"):
                errors.append(f"{where}: metadata.name missing")
            objects.setdefault(kind[1], []).append((name, doc))
    return objects, errors


def check_kustomization(docs, kustomization, optional, errors):
    """The files the kustomization applies; every file present is listed."""
    listed = set(kustomization["resources"])
    present = {n for n in docs if n != "kustomization.yaml"}
    for missing in sorted(present - listed - optional):
        errors.append(f"kustomization.yaml: {missing} is not in resources")
    for extra in sorted(listed - present):
        errors.append(f"kustomization.yaml: resource {extra} does not exist")
    return listed


def pods_of(kind, workload):
    """The pods `workload` runs, as the API server would label them: a
    StatefulSet's controller adds each pod's ordinal as POD_INDEX_LABEL
    (Kubernetes >= 1.28) and its name; one pod stands for a Deployment's
    identical replicas."""
    name = workload["metadata"]["name"]
    labels = workload["spec"]["template"]["metadata"].get("labels", {})
    if kind == "StatefulSet":
        return [{"name": f"{name}-{i}", "owner": f"{kind} {name}", "ordinal": i,
                 "labels": {**labels, POD_INDEX_LABEL: str(i),
                            "statefulset.kubernetes.io/pod-name": f"{name}-{i}"}}
                for i in range(workload["spec"].get("replicas", 1))]
    return [{"name": f"{name}-0", "owner": f"{kind} {name}", "ordinal": None,
             "labels": {**labels, "pod-template-hash": "0"}}]


def expand(text, env):
    """`text` with $(VAR) replaced, as the kubelet expands args; unknown ones
    stay ($$(VAR) escapes are not used here)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: env.get(m[1], m[0]), text)


def container_env(container, pod, namespace):
    """The container's environment in `pod` (values and downward API)."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
            continue
        path = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
        if m := re.fullmatch(r"metadata\.labels\['(.+)'\]", path):
            # The kubelet gives an empty value for a label the pod lacks.
            env[var["name"]] = pod["labels"].get(m[1], "")
        elif path == "metadata.name":
            env[var["name"]] = pod["name"]
        elif path == "metadata.namespace":
            env[var["name"]] = namespace or "default"
    return env


def flag_value(args, flag):
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
    return None


def check_http_probe(where, probe_name, action, ports, http_port, errors):
    """An httpGet probe: of the HTTP API's port, on the route that answers
    what the gRPC probe would ask."""
    if http_port is None:
        errors.append(f"{where}: {probe_name} is an httpGet probe but "
                      "http_listen_address is off")
        return
    port = action.get("port")
    port = ports.get(port) if isinstance(port, str) else port
    if port != http_port:
        errors.append(f"{where}: {probe_name} httpGet.port={action.get('port')}, "
                      f"the HTTP API listens on {http_port}")
    if action.get("path") != HTTP_PROBE_PATHS[probe_name]:
        errors.append(f"{where}: {probe_name} httpGet.path={action.get('path')!r}, "
                      f"not {HTTP_PROBE_PATHS[probe_name]}")


def check_knnd_workload(kind, workload, configmaps, config_pb2, errors,
                        namespace=None):
    """Checks a Deployment or StatefulSet running knnd against itself and
    the knnd config it mounts: ports, probes, memory, index volume, drain
    timing, security context, scrape annotations. Returns what the other
    checks need, or None when the knnd container or its config is missing."""
    from google.protobuf import text_format
    where = f"{kind} {workload['metadata']['name']}"
    pod = workload["spec"]["template"]
    pod_labels = pod["metadata"].get("labels", {})
    if not selects(workload["spec"]["selector"].get("matchLabels"), pod_labels):
        errors.append(f"{where}: selector does not match the pod template labels")
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    if "knnd" not in containers:
        errors.append(f"{where}: no container named knnd")
        return None
    c = containers["knnd"]

    # knnd's config, as knnd will parse it.
    args = c.get("args", [])
    config_path = flag_value(args, "--config")
    if config_path is None:
        errors.append(f"{where}: knnd has no --config argument")
        return None
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    configmap, config_key = None, None
    for vname, mount in mounts.items():
        source = volumes.get(vname, {}).get("configMap", {})
        mount_dir = mount["mountPath"].rstrip("/")
        if source.get("name") in configmaps and \
                config_path.startswith(mount_dir + "/"):
            configmap = configmaps[source["name"]]
            config_key = config_path[len(mount_dir) + 1:]
    if configmap is None or config_key not in configmap.get("data", {}):
        errors.append(f"{where}: --config {config_path} is not a key of a "
                      "ConfigMap mounted there")
        return None
    config = config_pb2.ServerConfig()
    try:
        text_format.Parse(configmap["data"][config_key], config)
    except text_format.ParseError as e:
        errors.append(f"ConfigMap {config_key} ({configmap['metadata']['name']}): {e}")
        return None
    grpc_port = port_of(config.listen_address)
    metrics_port = port_of(config.metrics_listen_address)
    http_port = (port_of(config.http_listen_address)
                 if config.http_listen_address else None)

    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if ports.get("grpc") != grpc_port:
        errors.append(f"{where}: containerPort grpc={ports.get('grpc')} but "
                      f"listen_address is {config.listen_address}")
    if ports.get("metrics") != metrics_port:
        errors.append(f"{where}: containerPort metrics={ports.get('metrics')} "
                      f"but metrics_listen_address is {config.metrics_listen_address}")
    if ports.get("http") != http_port:
        errors.append(f"{where}: containerPort http={ports.get('http')} but "
                      f"http_listen_address is {config.http_listen_address!r}")

    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c.get(probe_name)
        if probe is None:
            errors.append(f"{where}: {probe_name} missing")
            continue
        handlers = set(probe) & {"grpc", "exec", "httpGet", "tcpSocket"}
        if handlers == {"httpGet"}:
            check_http_probe(where, probe_name, probe["httpGet"], ports,
                             http_port, errors)
            continue
        if handlers != {"grpc"}:
            errors.append(f"{where}: {probe_name} must be a gRPC probe or an "
                          f"httpGet probe of the HTTP API, has {sorted(handlers)}")
            continue
        if probe["grpc"]["port"] != grpc_port:
            errors.append(f"{where}: {probe_name} grpc.port="
                          f"{probe['grpc']['port']}, knnd listens on {grpc_port}")
        if probe["grpc"].get("service", "") not in HEALTH_SERVICES:
            errors.append(f"{where}: {probe_name} asks for health service "
                          f"{probe['grpc']['service']!r}, knnd answers {HEALTH_SERVICES}")
    startup = c.get("startupProbe", {})
    startup_s = startup.get("failureThreshold", 3) * startup.get("periodSeconds", 10)
    if startup_s < MIN_STARTUP_SECONDS:
        errors.append(f"{where}: startupProbe allows {startup_s} s, less than "
                      f"{MIN_STARTUP_SECONDS} s for loading a large index")

    # Memory: a limit that holds at least the gate's bytes and the process,
    # and requests == limits (Guaranteed QoS, last to be evicted).
    resources = c.get("resources", {})
    limits, requests = resources.get("limits", {}), resources.get("requests", {})
    limit = limits.get("memory")
    if limit is None:
        errors.append(f"{where}: knnd has no memory limit")
    else:
        floor = config.max_inflight_bytes + PROCESS_BASELINE_BYTES
        if memory_bytes(limit) < floor:
            errors.append(f"{where}: memory limit {limit} is below "
                          f"max_inflight_bytes + {PROCESS_BASELINE_BYTES >> 20} MiB")
        request = requests.get("memory")
        if request is None or memory_bytes(request) != memory_bytes(limit):
            errors.append(f"{where}: memory request {request} is not the limit "
                          f"{limit} (requests == limits: Guaranteed QoS)")
    if "cpu" not in requests:
        errors.append(f"{where}: no cpu request")
    elif "cpu" not in limits or cpu_millis(requests["cpu"]) != cpu_millis(limits["cpu"]):
        errors.append(f"{where}: cpu request {requests['cpu']} is not the limit "
                      f"{limits.get('cpu')} (requests == limits: Guaranteed QoS)")

    # The index: a front (shard_targets) has none; anything else serves the
    # --index flag (which wins) or index_path from a read-only volume. The
    # flag may hold $(VARS) of the pod's environment, expanded per pod.
    pods = pods_of(kind, workload)
    index_arg = flag_value(args, "--index")
    index_paths = {}
    for p in pods:
        index_paths[p["name"]] = (
            expand(index_arg, container_env(c, p, namespace))
            if index_arg is not None else config.index_path)
    if config.shard_targets:
        if index_arg is not None or config.index_path:
            errors.append(f"{where}: a front (shard_targets) serves no index, but "
                          "--index or index_path is set")
        claims = sorted(n for n, v in volumes.items() if "persistentVolumeClaim" in v)
        if claims:
            errors.append(f"{where}: a front (shard_targets) holds no index, but "
                          f"mounts volumes {claims}")
    for path in sorted(set(index_paths.values())):
        if config.shard_targets:
            break
        if not path:
            errors.append(f"{where}: no index: neither --index nor index_path")
            continue
        if "$(" in path:
            errors.append(f"{where}: --index {path} uses a variable the "
                          "container does not define")
            continue
        index_mount = [m for m in mounts.values()
                       if path.startswith(m["mountPath"].rstrip("/") + "/")]
        if not index_mount:
            errors.append(f"{where}: no volume mounted holds the index {path}")
        elif not index_mount[0].get("readOnly"):
            errors.append(f"{where}: the index volume is not mounted readOnly")
        else:
            pvc = volumes.get(index_mount[0]["name"], {}).get("persistentVolumeClaim")
            if pvc is not None and not pvc.get("readOnly"):
                errors.append(f"{where}: the index PersistentVolumeClaim is not readOnly")

    # knnd waits shutdown_delay_ms itself (health NOT_SERVING meanwhile); a
    # preStop sleep would only add to it, with health still SERVING.
    pre_stop = c.get("lifecycle", {}).get("preStop")
    if pre_stop is not None:
        errors.append(f"{where}: a preStop hook ({pre_stop}) delays SIGTERM "
                      "with health still SERVING; knnd's shutdown_delay_ms "
                      "does that wait")
    if config.shutdown_delay_ms < 1000:
        errors.append(f"{where}: shutdown_delay_ms={config.shutdown_delay_ms} "
                      "leaves Kubernetes no time to remove the endpoint "
                      "before the drain (at least 1000)")
    needed = (config.shutdown_delay_ms + config.drain_grace_period_ms) / 1000
    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    if grace <= needed + CLOSE_MARGIN_S:
        errors.append(f"{where}: terminationGracePeriodSeconds={grace} is "
                      f"not above shutdown_delay_ms {config.shutdown_delay_ms} + "
                      f"drain_grace_period_ms {config.drain_grace_period_ms} + "
                      f"{CLOSE_MARGIN_S} s to close")

    pod_sc = pod["spec"].get("securityContext", {})
    sc = c.get("securityContext", {})
    if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
        errors.append(f"{where}: runAsNonRoot is not set")
    if sc.get("readOnlyRootFilesystem") is not True:
        errors.append(f"{where}: readOnlyRootFilesystem is not true")
    if sc.get("allowPrivilegeEscalation") is not False:
        errors.append(f"{where}: allowPrivilegeEscalation is not false")
    if sc.get("privileged"):
        errors.append(f"{where}: container is privileged")
    if "ALL" not in sc.get("capabilities", {}).get("drop", []):
        errors.append(f"{where}: capabilities are not dropped (drop: [ALL])")

    annotations = pod["metadata"].get("annotations", {})
    annotation_route = any(k.startswith(PROMETHEUS_ANNOTATION_PREFIX)
                           for k in annotations)
    if annotation_route and (
            annotations.get("prometheus.io/scrape") != "true" or
            annotations.get("prometheus.io/port") != str(metrics_port) or
            annotations.get("prometheus.io/path") != "/metrics"):
        errors.append(f"{where}: prometheus.io annotations must say scrape "
                      f"\"true\", port \"{metrics_port}\", path /metrics")
    if config.max_connection_age_ms == 0:
        errors.append(f"ConfigMap {configmap['metadata']['name']}: "
                      "max_connection_age_ms is 0: connections never rebalance")
    return {"where": where, "config": config, "container": c, "pods": pods,
            "configmap": configmap["metadata"]["name"],
            "ports": ports, "grpc_port": grpc_port, "metrics_port": metrics_port,
            "http_port": http_port,
            "annotation_route": annotation_route, "index_paths": index_paths}


def check_services(services, infos, errors):
    """Every Service selects knnd pods and its ports reach theirs; `infos`
    are check_knnd_workload's results. Returns {Service: selected pods}."""
    all_pods = [p for info in infos for p in info["pods"]]
    owner_info = {p["owner"]: info for info in infos for p in info["pods"]}
    selected = {}
    for name, svc in sorted(services.items()):
        chosen = [p for p in all_pods if selects(svc["spec"].get("selector"), p["labels"])]
        selected[name] = chosen
        if not chosen:
            errors.append(f"Service {name}: selector does not match the pods")
            continue
        info = owner_info[chosen[0]["owner"]]
        headless = svc["spec"].get("clusterIP") == "None"
        for p in svc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            target = info["ports"].get(target) if isinstance(target, str) else target
            if p.get("name") == "grpc" and target != info["grpc_port"]:
                errors.append(f"Service {name}: port grpc targets {target}, "
                              f"not {info['grpc_port']}")
            if p.get("name") == "metrics" and target != info["metrics_port"]:
                errors.append(f"Service {name}: port metrics targets {target}, "
                              f"not {info['metrics_port']}")
            if p.get("name") == "http" and target != info["http_port"]:
                errors.append(f"Service {name}: port http targets {target}, "
                              f"not the HTTP API's {info['http_port']}")
            # DNS of a headless Service returns the pods' own addresses:
            # clients dial the port of their target on the pod itself.
            if headless and p["port"] != target:
                errors.append(f"Service {name}: headless, so clients reach the "
                              f"pods at port {p['port']}, but it targets {target}")
        if not any(p.get("name") == "grpc" for p in svc["spec"]["ports"]):
            errors.append(f"Service {name}: no port named grpc")
    return selected


def check_manifests(docs, config_pb2):
    """All the errors found in deploy/k8s's `docs` ({file: [documents]})."""
    objects, errors = parse_objects(docs)
    if errors:
        return errors
    for kind in ("Kustomization", "Deployment", "ConfigMap", "PodDisruptionBudget",
                 "HorizontalPodAutoscaler", "ServiceMonitor"):
        if len(objects.get(kind, [])) != 1:
            errors.append(f"expected one {kind}, found {len(objects.get(kind, []))}")
    if len(objects.get("Service", [])) != 2:
        errors.append("expected two Services (ClusterIP and headless)")
    if errors:
        return errors

    _, kustomization = objects["Kustomization"][0]
    listed = check_kustomization(docs, kustomization, OPTIONAL_RESOURCES, errors)
    configmaps = {doc["metadata"]["name"]: doc for _, doc in objects["ConfigMap"]}
    _, deployment = objects["Deployment"][0]
    info = check_knnd_workload("Deployment", deployment, configmaps, config_pb2,
                               errors)
    if info is None:
        return errors
    ports, metrics_port = info["ports"], info["metrics_port"]
    pod_labels = info["pods"][0]["labels"]

    services = {doc["metadata"]["name"]: doc for _, doc in objects["Service"]}
    headless = [s for s in services.values() if s["spec"].get("clusterIP") == "None"]
    if len(headless) != 1:
        errors.append("expected one headless Service (clusterIP: None)")
    check_services(services, [info], errors)

    monitor_file, monitor = objects["ServiceMonitor"][0]
    annotation_route = info["annotation_route"]
    monitor_route = monitor_file in listed
    if annotation_route and monitor_route:
        errors.append(f"kustomization.yaml: both scrape routes are active, the "
                      f"pods' prometheus.io/* annotations and {monitor_file}: "
                      "every series would be scraped twice; keep one")
    elif not annotation_route and not monitor_route:
        errors.append(f"no scrape route: the pods have no prometheus.io/* "
                      f"annotations and {monitor_file} is not in the "
                      "kustomization's resources")
    chosen = [n for n, s in sorted(services.items())
              if selects(monitor["spec"]["selector"].get("matchLabels"),
                         s["metadata"].get("labels", {}))]
    if len(chosen) != 1:
        errors.append(f"ServiceMonitor: selects Services {chosen}, not exactly one")
    else:
        svc_ports = {p.get("name"): p for p in services[chosen[0]]["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            p = svc_ports.get(endpoint.get("port"))
            if p is None:
                errors.append(f"ServiceMonitor: Service {chosen[0]} has no port "
                              f"{endpoint.get('port')!r}")
            elif ports.get(p.get("targetPort")) != metrics_port and \
                    p.get("targetPort") != metrics_port:
                errors.append(f"ServiceMonitor: port {endpoint['port']} is not the "
                              "metrics port")
            if endpoint.get("path", "/metrics") != "/metrics":
                errors.append("ServiceMonitor: path is not /metrics")

    _, pdb = objects["PodDisruptionBudget"][0]
    if not selects(pdb["spec"].get("selector", {}).get("matchLabels"), pod_labels):
        errors.append("PodDisruptionBudget: selector does not match the pods")

    _, hpa = objects["HorizontalPodAutoscaler"][0]
    ref = hpa["spec"]["scaleTargetRef"]
    if (ref["kind"], ref["name"]) != ("Deployment", deployment["metadata"]["name"]):
        errors.append(f"HorizontalPodAutoscaler: scales {ref['kind']}/{ref['name']}")
    if not any(m.get("type") == "Resource" and m["resource"]["name"] == "cpu"
               for m in hpa["spec"].get("metrics", [])):
        errors.append("HorizontalPodAutoscaler: no cpu Resource metric")
    if hpa["spec"].get("minReplicas", 1) < 2:
        errors.append("HorizontalPodAutoscaler: minReplicas < 2 leaves the "
                      "PodDisruptionBudget no room")
    return errors


def shard_of(pods):
    """The one pod-index of `pods`, or None when they have none or several."""
    indexes = {p["labels"].get(POD_INDEX_LABEL) for p in pods}
    return int(indexes.pop()) if len(indexes) == 1 and None not in indexes else None


def check_sharded_manifests(docs, config_pb2):
    """All the errors found in deploy/k8s/sharded's `docs`: the checks of
    every knnd workload above, then the layout of a sharded index
    (docs/sharding.md): replica groups of shard servers whose ordinal is the
    shard, one headless Service and one budget per shard, and a front whose
    shard_targets name exactly those Services."""
    objects, errors = parse_objects(docs)
    if errors:
        return errors
    if len(objects.get("Kustomization", [])) != 1:
        errors.append("expected one Kustomization")
    if len(objects.get("Deployment", [])) != 1:
        errors.append("expected one Deployment (the front)")
    if len(objects.get("StatefulSet", [])) < 2:
        errors.append("expected two or more StatefulSets (replica groups of "
                      "the shard servers)")
    for kind in ("HorizontalPodAutoscaler", "ServiceMonitor"):
        if objects.get(kind):
            errors.append(f"unexpected {kind} in the sharded layout")
    if errors:
        return errors
    _, kustomization = objects["Kustomization"][0]
    check_kustomization(docs, kustomization, frozenset(), errors)
    namespace = kustomization.get("namespace")
    configmaps = {doc["metadata"]["name"]: doc for _, doc in objects.get("ConfigMap", [])}

    groups = {doc["metadata"]["name"]: doc for _, doc in objects["StatefulSet"]}
    _, front = objects["Deployment"][0]
    infos = {}
    for name, sts in sorted(groups.items()):
        infos[name] = check_knnd_workload("StatefulSet", sts, configmaps,
                                          config_pb2, errors, namespace)
    front_info = check_knnd_workload("Deployment", front, configmaps, config_pb2,
                                     errors, namespace)
    if front_info is None or None in infos.values():
        return errors
    for info in [front_info, *infos.values()]:
        if not info["annotation_route"]:
            errors.append(f"no scrape route: {info['where']}'s pods have no "
                          "prometheus.io/* annotations")

    services = {doc["metadata"]["name"]: doc for _, doc in objects.get("Service", [])}

    # Replica groups: one pod per shard each, interchangeable.
    replicas = {n: g["spec"].get("replicas", 1) for n, g in groups.items()}
    if len(set(replicas.values())) != 1:
        errors.append(f"StatefulSets: replicas differ {replicas}; each replica "
                      "group holds one pod per shard, so all have the shard count")
    shards = max(replicas.values())
    first_name = min(groups)
    first = groups[first_name]["spec"]["template"]
    for name, sts in sorted(groups.items()):
        where = f"StatefulSet {name}"
        if sts["spec"].get("podManagementPolicy") != "Parallel":
            errors.append(f"{where}: podManagementPolicy is not Parallel: the "
                          "shards would start one after the other")
        for other, other_info in sorted(infos.items()):
            if other != name and any(
                    selects(sts["spec"]["selector"].get("matchLabels"), p["labels"])
                    for p in other_info["pods"]):
                errors.append(f"{where}: selector also selects the pods of "
                              f"StatefulSet {other}")
        template = sts["spec"]["template"]
        if template["spec"] != first["spec"] or \
                template["metadata"].get("annotations") != first["metadata"].get("annotations") or \
                set(template["metadata"].get("labels", {})) != \
                set(first["metadata"].get("labels", {})):
            errors.append(f"{where}: pod template differs from StatefulSet "
                          f"{first_name}'s beyond the label values")
        governing = services.get(sts["spec"]["serviceName"])
        if governing is None or governing["spec"].get("clusterIP") != "None":
            errors.append(f"{where}: serviceName {sts['spec']['serviceName']} is "
                          "not a headless Service of this layout")
        elif not all(selects(governing["spec"].get("selector"), p["labels"])
                     for p in infos[name]["pods"]):
            errors.append(f"{where}: its serviceName {sts['spec']['serviceName']} "
                          "does not select its pods")

        # The shard number: $(POD_INDEX) in --index, from the pod-index label.
        c = infos[name]["container"]
        env = {v["name"]: v for v in c.get("env", [])}
        field = env.get("POD_INDEX", {}).get("valueFrom", {}).get("fieldRef", {})
        if field.get("fieldPath") != POD_INDEX_FIELD:
            errors.append(f"{where}: POD_INDEX is not defined from the label "
                          f"{POD_INDEX_LABEL} (fieldRef {POD_INDEX_FIELD})")
        if "$(POD_INDEX)" not in (flag_value(c.get("args", []), "--index") or ""):
            errors.append(f"{where}: --index does not depend on $(POD_INDEX): "
                          "every pod would serve the same shard")
        for path in infos[name]["index_paths"].values():
            if path.endswith((".faiss", ".index")):
                errors.append(f"{where}: --index {path} is a file; a shard "
                              "serves a versions directory (docs/sharding.md)")
                break

    # The same shard in every group, another one at every ordinal.
    path_of = {}
    for name, info in infos.items():
        for p in info["pods"]:
            path_of.setdefault(p["ordinal"], set()).add(info["index_paths"][p["name"]])
    for ordinal, paths in sorted(path_of.items()):
        if len(paths) != 1:
            errors.append(f"shard {ordinal}: the replica groups serve different "
                          f"indexes {sorted(paths)}")
    for a, b in itertools.combinations(sorted(path_of), 2):
        if path_of[a] & path_of[b]:
            errors.append(f"shards {a} and {b} serve the same index "
                          f"{sorted(path_of[a] & path_of[b])}")

    # The shards' config (one ConfigMap, or one per group).
    for configmap, info in sorted({i["configmap"]: i for i in infos.values()}.items()):
        config = info["config"]
        if config.keep_previous_versions < 1:
            errors.append(f"ConfigMap {configmap}: keep_previous_versions="
                          f"{config.keep_previous_versions}: a shard that swapped "
                          "first could not answer for the version the front pins "
                          "(docs/sharding.md, rule 4)")
        if config.index_poll_interval_ms == 0:
            errors.append(f"ConfigMap {configmap}: index_poll_interval_ms=0: a "
                          "shard never loads a newly published version by itself")
        if config.shard_targets:
            errors.append(f"ConfigMap {configmap}: a shard server has shard_targets")

    # One headless Service per shard: all the replicas of its shard, in every
    # group, and nothing else.
    selected = check_services(services, [front_info, *infos.values()], errors)
    shard_pods = [p for info in infos.values() for p in info["pods"]]
    front_pods = front_info["pods"]
    shard_services = {}
    for name, svc in sorted(services.items()):
        if POD_INDEX_LABEL not in (svc["spec"].get("selector") or {}):
            continue
        chosen = selected[name]
        shard = shard_of(chosen)
        if len(svc["spec"]["selector"]) < 2:
            errors.append(f"Service {name}: selects by {POD_INDEX_LABEL} alone, "
                          "which every StatefulSet's pods carry; add an app label")
        if svc["spec"].get("clusterIP") != "None":
            errors.append(f"Service {name}: a shard's Service must be headless "
                          "(clusterIP: None) for the front to balance calls")
        if shard is None:
            continue  # selects no pod: check_services said so
        replicas_of_shard = [p for p in shard_pods
                             if p["labels"][POD_INDEX_LABEL] == str(shard)]
        if sorted(p["name"] for p in chosen) != \
                sorted(p["name"] for p in replicas_of_shard):
            errors.append(f"Service {name}: selects {sorted(p['name'] for p in chosen)}"
                          f", not every replica of shard {shard} "
                          f"{sorted(p['name'] for p in replicas_of_shard)}")
            continue
        shard_services.setdefault(shard, []).append(name)
    for shard in range(shards):
        if len(shard_services.get(shard, [])) != 1:
            errors.append(f"shard {shard}: {len(shard_services.get(shard, []))} "
                          "Services select its replicas, not one")
    front_services = [n for n, pods in selected.items()
                      if pods and {p["owner"] for p in pods} == {front_pods[0]["owner"]}]
    kinds = {services[n]["spec"].get("clusterIP") == "None" for n in front_services}
    if kinds != {True, False}:
        errors.append(f"the front needs a ClusterIP and a headless Service, has "
                      f"{front_services}")

    # The front's targets: exactly the shard Services, by their DNS names.
    config = front_info["config"]
    expected = {names[0] for names in shard_services.values() if len(names) == 1}
    named = []
    shard_port = next(iter(infos.values()))["grpc_port"]
    for target in config.shard_targets:
        m = SHARD_TARGET.fullmatch(target)
        if not m:
            errors.append(f"front: shard target {target!r} is not "
                          "dns:///SERVICE.NAMESPACE.svc.cluster.local:PORT")
            continue
        service, target_namespace, port = m["service"], m["namespace"], int(m["port"])
        named.append(service)
        if service not in expected:
            errors.append(f"front: shard target {target} names {service}, not "
                          "the Service of one shard")
        if target_namespace != namespace:
            errors.append(f"front: shard target {target} is in namespace "
                          f"{target_namespace}, the kustomization's is {namespace}")
        if port != shard_port:
            errors.append(f"front: shard target {target} dials port {port}, the "
                          f"shards listen on {shard_port}")
    for service in sorted({n for n in named if named.count(n) > 1}):
        errors.append(f"front: shard_targets name {service} more than once")
    for service in sorted(expected - set(named)):
        errors.append(f"front: shard Service {service} is not in shard_targets")
    if len(config.shard_targets) != shards:
        errors.append(f"front: {len(config.shard_targets)} shard_targets for "
                      f"{shards} shards")

    # Budgets: each selects existing pods; one per shard, keeping all but one
    # replica of it; one for the front.
    pdb_shards = {}
    front_budget = False
    for _, pdb in objects.get("PodDisruptionBudget", []):
        where = f"PodDisruptionBudget {pdb['metadata']['name']}"
        selector = pdb["spec"].get("selector", {}).get("matchLabels")
        chosen = [p for p in shard_pods + front_pods if selects(selector, p["labels"])]
        if not chosen:
            errors.append(f"{where}: selects no pod")
            continue
        if chosen == front_pods:
            front_budget = True
            continue
        shard = shard_of(chosen)
        replicas_of_shard = [p for p in shard_pods
                             if p["labels"][POD_INDEX_LABEL] == str(shard)]
        if shard is None or sorted(p["name"] for p in chosen) != \
                sorted(p["name"] for p in replicas_of_shard):
            errors.append(f"{where}: selects {sorted(p['name'] for p in chosen)}, "
                          "not the replicas of one shard nor the front")
            continue
        pdb_shards.setdefault(shard, []).append(where)
        if len(selector) < 2:
            errors.append(f"{where}: selects by {POD_INDEX_LABEL} alone, which "
                          "every StatefulSet's pods carry; add an app label")
        # For maxUnavailable and percentages Kubernetes counts every pod of
        # the selected pods' StatefulSets (all shards), not the selected
        # ones, and would never allow an eviction.
        minimum = pdb["spec"].get("minAvailable")
        if "maxUnavailable" in pdb["spec"] or not isinstance(minimum, int):
            errors.append(f"{where}: a shard's budget needs an integer "
                          "minAvailable (maxUnavailable and percentages count "
                          "every pod of the StatefulSets)")
        elif minimum != len(groups) - 1:
            errors.append(f"{where}: minAvailable {minimum} with {len(groups)} "
                          f"replica groups; {len(groups) - 1} lets exactly one "
                          "replica of the shard go at a time")
    for shard in range(shards):
        if len(pdb_shards.get(shard, [])) != 1:
            errors.append(f"shard {shard}: {len(pdb_shards.get(shard, []))} "
                          "PodDisruptionBudgets, not one")
    if not front_budget:
        errors.append("no PodDisruptionBudget selects exactly the front's pods")
    if front["spec"].get("replicas", 1) < 2:
        errors.append("Deployment: the front has fewer than 2 replicas, which "
                      "leaves its PodDisruptionBudget no room")
    return errors


# ---- deploy/k8s-bucket: versions from object storage ----
# The sync's image as the overlay's containers name it (kustomization.yaml
# sets the registry path), and its arguments (deploy/bucket-sync).
BUCKET_SYNC_IMAGE = "knnd-bucket-sync"
# Environment names that hold credentials: never a literal value.
CREDENTIAL_NAME = re.compile(r"ACCESS_KEY|SECRET|TOKEN|PASSWORD|SESSION|SAS_|ACCOUNT_KEY",
                             re.IGNORECASE)


def strategic_merge(base, patch):
    """`patch` applied to `base` as kustomize's strategic-merge patches do
    for the fields the overlay uses: maps merged key by key (null deletes a
    key), lists of named objects (containers, volumes, env) merged by name,
    volumeMounts by mountPath, any other list or scalar replaced."""
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, list) and isinstance(merged.get(key), list) and \
                value and all(isinstance(v, dict) for v in value):
            merge_key = "mountPath" if key == "volumeMounts" else "name"
            items = list(merged[key])
            for item in value:
                at = [i for i, old in enumerate(items)
                      if merge_key in item and old.get(merge_key) == item[merge_key]]
                if at:
                    items[at[0]] = strategic_merge(items[at[0]], item)
                else:
                    items.append(copy.deepcopy(item))
            merged[key] = items
        else:
            merged[key] = strategic_merge(merged.get(key), value)
    return merged


def render_overlay(overlay_docs, base_docs):
    """The base's {file: [documents]} with the overlay kustomization's
    patches applied to the objects they name (kind and name), and the
    errors of the overlay's own layout: its one base, every file a patch
    of an object of the base and listed once."""
    errors = []
    kustomization = overlay_docs.get("kustomization.yaml", [{}])[0]
    if kustomization.get("resources") != ["../k8s"]:
        errors.append(f"kustomization.yaml: resources {kustomization.get('resources')} "
                      "is not the PersistentVolumeClaim variant ['../k8s'] alone")
    listed = [p.get("path") for p in kustomization.get("patches", [])]
    present = sorted(n for n in overlay_docs if n != "kustomization.yaml")
    if sorted(listed) != present:
        errors.append(f"kustomization.yaml: patches {sorted(listed)} are not the "
                      f"files present {present}")
    rendered = copy.deepcopy(base_docs)
    for name in listed:
        for patch in overlay_docs.get(name, []):
            target = [(f, i) for f, docs in rendered.items()
                      for i, d in enumerate(docs)
                      if (d.get("kind"), d.get("metadata", {}).get("name")) ==
                      (patch.get("kind"), patch.get("metadata", {}).get("name"))]
            if len(target) != 1:
                errors.append(f"{name}: {patch.get('kind')} "
                              f"{patch.get('metadata', {}).get('name')} is not "
                              "one object of deploy/k8s")
                continue
            f, i = target[0]
            rendered[f][i] = strategic_merge(rendered[f][i], patch)
    if not any(i.get("name") == BUCKET_SYNC_IMAGE for i in kustomization.get("images", [])):
        errors.append(f"kustomization.yaml: no images entry for {BUCKET_SYNC_IMAGE}")
    return rendered, errors


def sync_containers(pod_spec):
    """(init containers, containers) running the bucket sync's image."""
    def of(key):
        return [c for c in pod_spec.get(key, [])
                if c.get("image", "").split(":")[0].rsplit("/", 1)[-1] == BUCKET_SYNC_IMAGE]
    return of("initContainers"), of("containers")


def env_names(container):
    return {e["name"]: e for e in container.get("env", [])}


def check_credentials(pod_spec, configmaps, errors):
    """Credentials only from a Secret or workload identity, only to the
    sync containers: never a literal value, never in a ConfigMap, never in
    knnd's environment."""
    for c in pod_spec.get("initContainers", []) + pod_spec.get("containers", []):
        for name, var in env_names(c).items():
            if CREDENTIAL_NAME.search(name) and "value" in var:
                errors.append(f"container {c['name']}: {name} has a literal value; "
                              "credentials come from a Secret (envFrom) or "
                              "workload identity")
    knnd = [c for c in pod_spec.get("containers", []) if c["name"] == "knnd"]
    for c in knnd:
        secret_env = [v["name"] for v in c.get("env", [])
                      if "secretKeyRef" in v.get("valueFrom", {})]
        if secret_env or any("secretRef" in e for e in c.get("envFrom", [])):
            errors.append("container knnd: takes a Secret's values; the bucket's "
                          "credentials are the sync containers' only")
    for name, cm in configmaps.items():
        for key, text in cm.get("data", {}).items():
            if re.search(r"RCLONE_|secret_access_key|access_key_id", str(text),
                         re.IGNORECASE):
                errors.append(f"ConfigMap {name}: {key} holds rclone settings or "
                              "credentials; they belong to the sync containers' "
                              "environment and a Secret")


def check_sync_container(c, pod_spec, versions_dir, errors):
    """One sync container: its arguments, remote, volume, budget, bounds,
    resources and security context. Returns its --remote."""
    where = f"container {c['name']}"
    args = c.get("args", [])
    remote = flag_value(args, "--remote") or ""
    if ":" not in remote:
        errors.append(f"{where}: --remote {remote!r} is not REMOTE:bucket/prefix")
    else:
        env = env_names(c)
        name = remote.split(":", 1)[0].upper()
        if f"RCLONE_CONFIG_{name}_TYPE" not in env:
            errors.append(f"{where}: remote {remote.split(':', 1)[0]!r} has no "
                          f"RCLONE_CONFIG_{name}_TYPE in the environment")
        elif not (any("secretRef" in e for e in c.get("envFrom", [])) or
                  env.get(f"RCLONE_CONFIG_{name}_ENV_AUTH", {}).get("value") == "true"):
            errors.append(f"{where}: no credentials: neither a Secret (envFrom) "
                          f"nor RCLONE_CONFIG_{name}_ENV_AUTH \"true\" "
                          "(workload identity)")
    if flag_value(args, "--versions_dir") != versions_dir:
        errors.append(f"{where}: --versions_dir {flag_value(args, '--versions_dir')} "
                      f"is not knnd's index {versions_dir}")
    for flag in ("--bwlimit", "--transfers", "--disk_budget_bytes"):
        if flag_value(args, flag) is None:
            errors.append(f"{where}: {flag} is not set: the sync's rate and "
                          "disk use are bounded")
    keep = flag_value(args, "--keep")
    if keep is not None and int(keep) < 2:
        errors.append(f"{where}: --keep {keep} would remove the version serving "
                      "while the next one loads (at least 2)")

    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    mounts = [m for m in c.get("volumeMounts", [])
              if versions_dir.startswith(m["mountPath"].rstrip("/") + "/")]
    if not mounts:
        errors.append(f"{where}: no volume mounted holds {versions_dir}")
    else:
        if mounts[0].get("readOnly"):
            errors.append(f"{where}: mounts {versions_dir}'s volume readOnly")
        empty_dir = volumes.get(mounts[0]["name"], {}).get("emptyDir")
        if empty_dir is None or "sizeLimit" not in empty_dir:
            errors.append(f"{where}: {versions_dir}'s volume is not an emptyDir "
                          "with a sizeLimit (the disk budget)")
        elif flag_value(args, "--disk_budget_bytes") is not None and \
                int(flag_value(args, "--disk_budget_bytes")) > \
                memory_bytes(empty_dir["sizeLimit"]):
            errors.append(f"{where}: --disk_budget_bytes "
                          f"{flag_value(args, '--disk_budget_bytes')} exceeds the "
                          f"volume's sizeLimit {empty_dir['sizeLimit']}")
    if not any(m["mountPath"] == "/tmp" for m in c.get("volumeMounts", [])):
        errors.append(f"{where}: no volume at /tmp (the root filesystem is "
                      "read-only; the sync writes its file lists there)")

    resources = c.get("resources", {})
    for part in ("requests", "limits"):
        for what in ("cpu", "memory"):
            if what not in resources.get(part, {}):
                errors.append(f"{where}: no {what} {part[:-1]}")
    sc = c.get("securityContext", {})
    if not (sc.get("runAsNonRoot") or pod_spec.get("securityContext", {}).get("runAsNonRoot")):
        errors.append(f"{where}: runAsNonRoot is not set")
    if sc.get("readOnlyRootFilesystem") is not True:
        errors.append(f"{where}: readOnlyRootFilesystem is not true")
    if sc.get("allowPrivilegeEscalation") is not False:
        errors.append(f"{where}: allowPrivilegeEscalation is not false")
    if "ALL" not in sc.get("capabilities", {}).get("drop", []):
        errors.append(f"{where}: capabilities are not dropped (drop: [ALL])")
    return remote


def check_bucket_manifests(overlay_docs, base_docs, config_pb2):
    """All the errors found in deploy/k8s-bucket: the overlay rendered onto
    deploy/k8s passes every check of deploy/k8s, and the bucket's own:
    knnd serves a versions directory on an emptyDir with a sizeLimit and
    polls it; an init container (--once) and a sidecar run the sync into
    that directory from one remote, bounded in rate, disk and resources;
    credentials reach the sync containers only, from a Secret or workload
    identity."""
    rendered, errors = render_overlay(overlay_docs, base_docs)
    errors += check_manifests(rendered, config_pb2)
    if errors:
        return errors
    objects, _ = parse_objects(rendered)
    configmaps = {doc["metadata"]["name"]: doc for _, doc in objects["ConfigMap"]}
    _, deployment = objects["Deployment"][0]
    info = check_knnd_workload("Deployment", deployment, configmaps, config_pb2, [])
    pod_spec = deployment["spec"]["template"]["spec"]
    versions_dir = next(iter(info["index_paths"].values()))
    if info["config"].index_poll_interval_ms == 0:
        errors.append(f"ConfigMap {info['configmap']}: index_poll_interval_ms=0: "
                      "knnd never finds the versions the sync brings")
    claims = [v["name"] for v in pod_spec.get("volumes", [])
              if "persistentVolumeClaim" in v]
    if claims:
        errors.append(f"Deployment: mounts PersistentVolumeClaims {claims}; the "
                      "bucket variant's index is on the pod's own disk")
    inits, sidecars = sync_containers(pod_spec)
    once = [c for c in inits if "--once" in c.get("args", [])]
    polling = [c for c in sidecars if "--once" not in c.get("args", [])]
    if len(once) != 1:
        errors.append(f"expected one init container running the sync with "
                      f"--once, found {len(once)}")
    if len(polling) != 1 or len(sidecars) != 1:
        errors.append(f"expected one sidecar running the sync without --once, "
                      f"found {len(polling)}")
    elif flag_value(polling[0].get("args", []), "--poll_interval_s") is None:
        errors.append(f"container {polling[0]['name']}: --poll_interval_s is "
                      "not set")
    remotes = {check_sync_container(c, pod_spec, versions_dir, errors)
               for c in once + polling}
    if len(remotes) > 1:
        errors.append(f"the init container and the sidecar sync different "
                      f"remotes {sorted(remotes)}")
    check_credentials(pod_spec, configmaps, errors)
    return errors


_PROTO_DIR = None


def config_module():
    """knnd.v1.config_pb2, compiled once from the source tree's proto."""
    global _PROTO_DIR
    if _PROTO_DIR is None:
        _PROTO_DIR = tempfile.TemporaryDirectory()
        proto = os.path.join(ARGS.source_dir, "proto")
        subprocess.run(["protoc", f"--proto_path={proto}",
                        f"--python_out={_PROTO_DIR.name}",
                        os.path.join(proto, "knnd/v1/config.proto")], check=True)
        sys.path.insert(0, _PROTO_DIR.name)
    from knnd.v1 import config_pb2
    return config_pb2


class ManifestTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.config_pb2 = config_module()
        cls.dir = os.path.join(ARGS.source_dir, "deploy", "k8s")
        cls.docs = load_dir(cls.dir)

    def errors_after(self, change):
        docs = copy.deepcopy(self.docs)
        change(docs)
        return "\n".join(check_manifests(docs, self.config_pb2))

    def container(self, docs):
        return docs["deployment.yaml"][0]["spec"]["template"]["spec"]["containers"][0]

    def config_change(self, old, new):
        def change(docs):
            data = docs["configmap.yaml"][0]["data"]
            self.assertIn(old, data["knnd.textproto"])
            data["knnd.textproto"] = data["knnd.textproto"].replace(old, new)
        return change

    def test_repository_manifests_pass(self):
        self.assertEqual(
            sorted(self.docs), sorted(["kustomization.yaml", "configmap.yaml",
                                       "deployment.yaml", "service.yaml",
                                       "service-headless.yaml", "pdb.yaml",
                                       "hpa.yaml", "servicemonitor.yaml"]))
        self.assertEqual(check_manifests(self.docs, self.config_pb2), [])
        # The default scrape route is the pods' annotations; the
        # ServiceMonitor is opt-in (kustomization.yaml says how).
        self.assertNotIn("servicemonitor.yaml",
                         self.docs["kustomization.yaml"][0]["resources"])

    def test_the_schema_check_knows_required_fields(self):
        self.assertIn("containers", fields_of("V1PodSpec")[1])
        self.assertIn("port", fields_of("GRPCAction")[1])
        self.assertNotIn("replicas", fields_of("V1DeploymentSpec")[1])
        self.assertIn("serviceName", fields_of("V1StatefulSetSpec")[1])
        self.assertEqual(fields_of("V1TopologySpreadConstraint")[0]["matchLabelKeys"],
                         "list[str]")

    def test_duplicate_keys_are_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "a.yaml"), "w") as f:
                f.write("kind: Service\nkind: ConfigMap\n")
            with self.assertRaisesRegex(yaml.YAMLError, "duplicate key 'kind'"):
                load_dir(tmp)

    def test_detects_schema_errors(self):
        def typo(docs):
            self.container(docs)["readinesProbe"] = self.container(docs).pop("readinessProbe")
        self.assertIn("readinesProbe: unknown field of V1Container", self.errors_after(typo))

        def wrong_type(docs):
            self.container(docs)["ports"][0]["containerPort"] = "50051"
        self.assertIn("containerPort: expected int", self.errors_after(wrong_type))

        def no_name(docs):
            del self.container(docs)["name"]
        self.assertIn("V1Container requires name", self.errors_after(no_name))

        def grpc_without_port(docs):
            del self.container(docs)["startupProbe"]["grpc"]["port"]
        self.assertIn("GRPCAction requires port", self.errors_after(grpc_without_port))

    def test_detects_missing_memory_limit(self):
        def change(docs):
            del self.container(docs)["resources"]["limits"]["memory"]
        self.assertIn("no memory limit", self.errors_after(change))

    def test_detects_a_memory_limit_below_the_admitted_request_memory(self):
        self.assertIn("below max_inflight_bytes", self.errors_after(
            self.config_change("max_inflight_bytes: 268435456",
                               "max_inflight_bytes: 4294967296")))

    def test_detects_probe_errors(self):
        def http(docs):
            self.container(docs)["livenessProbe"] = {"httpGet": {"port": 9090, "path": "/"}}
        self.assertIn("livenessProbe is an httpGet probe but http_listen_address "
                      "is off", self.errors_after(http))

        def exec_probe(docs):
            self.container(docs)["livenessProbe"] = {"exec": {"command": ["true"]}}
        self.assertIn("livenessProbe must be a gRPC probe or an httpGet probe",
                      self.errors_after(exec_probe))

        def port(docs):
            self.container(docs)["readinessProbe"]["grpc"]["port"] = 9090
        self.assertIn("readinessProbe grpc.port=9090", self.errors_after(port))

        def service(docs):
            self.container(docs)["startupProbe"]["grpc"]["service"] = "knnd"
        self.assertIn("health service 'knnd'", self.errors_after(service))

        def short(docs):
            self.container(docs)["startupProbe"]["failureThreshold"] = 3
        self.assertIn("startupProbe allows 15 s", self.errors_after(short))

    def http_variant(self, probes):
        """The files with the HTTP API turned on as their comments say, and
        with `probes` the HTTP probes in place of the gRPC ones."""
        docs = load_dir(self.dir, uncomment=("http",))
        if probes:
            self.container(docs).update(
                commented_block(self.dir, "deployment.yaml", "http-probes"))
        return docs

    def test_the_http_variants_pass(self):
        for probes in (False, True):
            docs = self.http_variant(probes)
            self.assertIn("http_listen_address",
                          docs["configmap.yaml"][0]["data"]["knnd.textproto"])
            self.assertEqual(check_manifests(docs, self.config_pb2), [], probes)
        self.assertIn("httpGet", self.container(self.http_variant(True))["livenessProbe"])

    def test_detects_http_port_and_probe_mismatches(self):
        def errors(change, probes=True):
            docs = self.http_variant(probes)
            change(docs)
            return "\n".join(check_manifests(docs, self.config_pb2))

        def no_listener(docs):
            data = docs["configmap.yaml"][0]["data"]
            data["knnd.textproto"] = data["knnd.textproto"].replace(
                'http_listen_address: "0.0.0.0:8080"', "")
        self.assertIn("containerPort http=8080 but http_listen_address is ''",
                      errors(no_listener, probes=False))

        def wrong_path(docs):
            self.container(docs)["readinessProbe"]["httpGet"]["path"] = "/healthz/live"
        self.assertIn("readinessProbe httpGet.path='/healthz/live', not /healthz/ready",
                      errors(wrong_path))

        def wrong_port(docs):
            self.container(docs)["livenessProbe"]["httpGet"]["port"] = 9090
        self.assertIn("livenessProbe httpGet.port=9090, the HTTP API listens on 8080",
                      errors(wrong_port))

        def service(docs):
            docs["service.yaml"][0]["spec"]["ports"][-1]["targetPort"] = "metrics"
        self.assertIn("port http targets 9090, not the HTTP API's 8080",
                      errors(service))

    def test_detects_a_container_port_that_is_not_the_configs(self):
        errors = self.errors_after(self.config_change(
            'listen_address: "0.0.0.0:50051"', 'listen_address: "0.0.0.0:50052"'))
        self.assertIn("containerPort grpc=50051 but listen_address is 0.0.0.0:50052",
                      errors)
        self.assertIn("grpc.port=50051, knnd listens on 50052", errors)

    def test_detects_config_errors(self):
        self.assertIn("ConfigMap knnd.textproto", self.errors_after(
            self.config_change("num_workers: 2", "num_worker: 2")))
        self.assertIn("connections never rebalance", self.errors_after(
            self.config_change("max_connection_age_ms: 300000",
                               "max_connection_age_ms: 0")))

    def test_detects_a_writable_index_or_root_filesystem(self):
        def index(docs):
            self.container(docs)["volumeMounts"][0]["readOnly"] = False
        self.assertIn("index volume is not mounted readOnly", self.errors_after(index))

        def root(docs):
            self.container(docs)["securityContext"]["readOnlyRootFilesystem"] = False
        self.assertIn("readOnlyRootFilesystem is not true", self.errors_after(root))

        def caps(docs):
            self.container(docs)["securityContext"]["capabilities"]["drop"] = []
        self.assertIn("capabilities are not dropped", self.errors_after(caps))

    def test_detects_a_grace_period_shorter_than_the_shutdown(self):
        def change(docs):
            docs["deployment.yaml"][0]["spec"]["template"]["spec"][
                "terminationGracePeriodSeconds"] = 26
        self.assertIn("terminationGracePeriodSeconds=26", self.errors_after(change))

    def test_detects_a_pre_stop_sleep_and_a_short_shutdown_delay(self):
        def sleep(docs):
            self.container(docs)["lifecycle"] = {
                "preStop": {"exec": {"command": ["/bin/sleep", "5"]}}}
        self.assertIn("a preStop hook", self.errors_after(sleep))

        short = self.config_change("shutdown_delay_ms: 5000", "shutdown_delay_ms: 0")
        self.assertIn("shutdown_delay_ms=0", self.errors_after(short))

    def test_detects_selector_mismatches(self):
        def monitor(docs):
            docs["servicemonitor.yaml"][0]["spec"]["selector"]["matchLabels"] = {
                "app.kubernetes.io/name": "knnd"}
        self.assertIn("ServiceMonitor: selects Services ['knnd', 'knnd-headless']",
                      self.errors_after(monitor))

        def monitor_port(docs):
            docs["servicemonitor.yaml"][0]["spec"]["endpoints"][0]["port"] = "http"
        self.assertIn("has no port 'http'", self.errors_after(monitor_port))

        def service(docs):
            docs["service-headless.yaml"][0]["spec"]["selector"] = {"app": "other"}
        self.assertIn("Service knnd-headless: selector does not match",
                      self.errors_after(service))

        def annotation(docs):
            docs["deployment.yaml"][0]["spec"]["template"]["metadata"][
                "annotations"]["prometheus.io/port"] = "8080"
        self.assertIn("prometheus.io annotations", self.errors_after(annotation))

    def annotations(self, docs):
        return docs["deployment.yaml"][0]["spec"]["template"]["metadata"][
            "annotations"]

    def test_detects_both_scrape_routes_active(self):
        def both(docs):
            docs["kustomization.yaml"][0]["resources"].append("servicemonitor.yaml")
        self.assertIn("both scrape routes are active", self.errors_after(both))

    def test_the_servicemonitor_alone_is_one_scrape_route(self):
        def monitor_only(docs):
            docs["kustomization.yaml"][0]["resources"].append("servicemonitor.yaml")
            for key in list(self.annotations(docs)):
                if key.startswith(PROMETHEUS_ANNOTATION_PREFIX):
                    del self.annotations(docs)[key]
        self.assertEqual(self.errors_after(monitor_only), "")

    def test_detects_no_scrape_route(self):
        def none(docs):
            self.annotations(docs).clear()
        self.assertIn("no scrape route", self.errors_after(none))

    def test_detects_a_resource_missing_from_the_kustomization(self):
        def change(docs):
            docs["kustomization.yaml"][0]["resources"].remove("pdb.yaml")
        self.assertIn("pdb.yaml is not in resources", self.errors_after(change))


class ShardedManifestTest(unittest.TestCase):
    """deploy/k8s/sharded: the checks of every knnd workload, and those of a
    sharded index. Each negative test breaks a copy of the manifests and
    expects the check that guards it to fail."""

    @classmethod
    def setUpClass(cls):
        cls.config_pb2 = config_module()
        cls.dir = os.path.join(ARGS.source_dir, "deploy", "k8s", "sharded")
        cls.docs = load_dir(cls.dir)

    def errors_after(self, change):
        docs = copy.deepcopy(self.docs)
        change(docs)
        return "\n".join(check_sharded_manifests(docs, self.config_pb2))

    def doc(self, docs, file_name, name):
        found = [d for d in docs[file_name] if d["metadata"]["name"] == name]
        self.assertEqual(len(found), 1, f"{file_name}: {name}")
        return found[0]

    def group(self, docs, name="knnd-shard-b"):
        return self.doc(docs, "statefulset-shard.yaml", name)

    def shard_container(self, docs, name="knnd-shard-b"):
        return self.group(docs, name)["spec"]["template"]["spec"]["containers"][0]

    def both_groups(self, docs):
        return [self.group(docs, "knnd-shard-a"), self.group(docs, "knnd-shard-b")]

    def config_change(self, file_name, old, new):
        def change(docs):
            data = docs[file_name][0]["data"]
            self.assertIn(old, data["knnd.textproto"])
            data["knnd.textproto"] = data["knnd.textproto"].replace(old, new)
        return change

    def front_config_change(self, old, new):
        return self.config_change("configmap-front.yaml", old, new)

    def test_repository_manifests_pass(self):
        self.assertEqual(
            sorted(self.docs), sorted(["kustomization.yaml", "configmap-shard.yaml",
                                       "statefulset-shard.yaml", "service-shard.yaml",
                                       "configmap-front.yaml", "deployment-front.yaml",
                                       "service-front.yaml", "pdb.yaml"]))
        self.assertEqual(check_sharded_manifests(self.docs, self.config_pb2), [])

    @unittest.skipUnless(shutil.which("kubectl"), "kubectl is not installed")
    def test_kustomize_renders_it_into_one_namespace(self):
        # `kubectl kustomize` builds offline; every object lands in the
        # namespace that the front's shard_targets name.
        out = subprocess.run(["kubectl", "kustomize", self.dir], check=True,
                             capture_output=True, text=True, timeout=120).stdout
        rendered = [d for d in yaml.safe_load_all(out) if d]
        self.assertEqual(len(rendered), sum(
            len(v) for k, v in self.docs.items() if k != "kustomization.yaml"))
        self.assertEqual({d["metadata"].get("namespace") for d in rendered},
                         {self.docs["kustomization.yaml"][0]["namespace"]})

    def test_the_simulated_pods_carry_their_shard_number(self):
        pods = pods_of("StatefulSet", self.group(self.docs))
        self.assertEqual([p["labels"][POD_INDEX_LABEL] for p in pods], ["0", "1"])
        container = self.shard_container(self.docs)
        env = container_env(container, pods[1], "search")
        self.assertEqual(expand(flag_value(container["args"], "--index"), env),
                         "/models/shard-1")

    def test_the_workload_checks_run_on_the_shards_and_the_front(self):
        def probe(docs):
            self.shard_container(docs)["readinessProbe"]["grpc"]["port"] = 9090
        self.assertIn("StatefulSet knnd-shard-b: readinessProbe grpc.port=9090",
                      self.errors_after(probe))

        def writable(docs):
            self.shard_container(docs)["volumeMounts"][0]["readOnly"] = False
        self.assertIn("knnd-shard-b: the index volume is not mounted readOnly",
                      self.errors_after(writable))

        def grace(docs):
            self.doc(docs, "deployment-front.yaml", "knnd-front")["spec"]["template"][
                "spec"]["terminationGracePeriodSeconds"] = 10
        self.assertIn("Deployment knnd-front: terminationGracePeriodSeconds=10",
                      self.errors_after(grace))

    def test_detects_a_missing_memory_limit_or_requests_not_the_limits(self):
        def no_limit(docs):
            del self.shard_container(docs)["resources"]["limits"]["memory"]
        self.assertIn("StatefulSet knnd-shard-b: knnd has no memory limit",
                      self.errors_after(no_limit))

        def request(docs):
            self.shard_container(docs)["resources"]["requests"]["memory"] = "8Gi"
        self.assertIn("memory request 8Gi is not the limit", self.errors_after(request))

        def cpu(docs):
            self.doc(docs, "deployment-front.yaml", "knnd-front")["spec"]["template"][
                "spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500m"
        self.assertIn("Deployment knnd-front: cpu request 500m is not the limit",
                      self.errors_after(cpu))

        self.assertIn("knnd-front: memory limit 448Mi is below max_inflight_bytes",
                      self.errors_after(self.front_config_change(
                          "max_inflight_bytes: 268435456",
                          "max_inflight_bytes: 1073741824")))

    def test_detects_an_index_not_taken_from_the_pod_index(self):
        def literal(docs):
            for sts in self.both_groups(docs):
                sts["spec"]["template"]["spec"]["containers"][0]["args"][3] = \
                    "/models/shard-0"
        errors = self.errors_after(literal)
        self.assertIn("knnd-shard-a: --index does not depend on $(POD_INDEX)", errors)
        self.assertIn("shards 0 and 1 serve the same index ['/models/shard-0']", errors)

        def other_field(docs):
            for sts in self.both_groups(docs):
                sts["spec"]["template"]["spec"]["containers"][0]["env"][0][
                    "valueFrom"]["fieldRef"]["fieldPath"] = "metadata.name"
        errors = self.errors_after(other_field)
        self.assertIn("knnd-shard-a: POD_INDEX is not defined from the label "
                      "apps.kubernetes.io/pod-index", errors)

        def undefined(docs):
            for sts in self.both_groups(docs):
                del sts["spec"]["template"]["spec"]["containers"][0]["env"]
        errors = self.errors_after(undefined)
        self.assertIn("--index /models/shard-$(POD_INDEX) uses a variable the "
                      "container does not define", errors)
        self.assertIn("POD_INDEX is not defined", errors)

        def no_index(docs):
            for sts in self.both_groups(docs):
                del sts["spec"]["template"]["spec"]["containers"][0]["args"][2:4]
        self.assertIn("knnd-shard-a: no index: neither --index nor index_path",
                      self.errors_after(no_index))

        def a_file(docs):
            for sts in self.both_groups(docs):
                sts["spec"]["template"]["spec"]["containers"][0]["args"][3] = \
                    "/models/shard-$(POD_INDEX)/1/index.faiss"
        self.assertIn("is a file; a shard serves a versions directory",
                      self.errors_after(a_file))

    def test_detects_replica_groups_that_differ(self):
        def replicas(docs):
            self.group(docs)["spec"]["replicas"] = 3
        errors = self.errors_after(replicas)
        self.assertIn("replicas differ {'knnd-shard-a': 2, 'knnd-shard-b': 3}", errors)

        def drift(docs):
            self.shard_container(docs)["args"][3] = "/other/shard-$(POD_INDEX)"
        errors = self.errors_after(drift)
        self.assertIn("StatefulSet knnd-shard-b: pod template differs", errors)
        self.assertIn("shard 0: the replica groups serve different indexes", errors)

        def ordered(docs):
            del self.group(docs)["spec"]["podManagementPolicy"]
        self.assertIn("knnd-shard-b: podManagementPolicy is not Parallel",
                      self.errors_after(ordered))

        def overlapping(docs):
            del self.group(docs)["spec"]["selector"]["matchLabels"]["knnd/replica-group"]
        self.assertIn("knnd-shard-b: selector also selects the pods of StatefulSet "
                      "knnd-shard-a", self.errors_after(overlapping))

        def governing(docs):
            self.group(docs)["spec"]["serviceName"] = "knnd-shard-x"
        self.assertIn("serviceName knnd-shard-x is not a headless Service",
                      self.errors_after(governing))

        def governing_elsewhere(docs):
            self.doc(docs, "service-shard.yaml", "knnd-shards")["spec"]["selector"][
                "knnd/replica-group"] = "a"
        self.assertIn("knnd-shard-b: its serviceName knnd-shards does not select "
                      "its pods", self.errors_after(governing_elsewhere))

    def test_detects_a_layout_that_is_not_groups_and_a_front(self):
        def one_group(docs):
            docs["statefulset-shard.yaml"].pop()
        self.assertIn("expected two or more StatefulSets", self.errors_after(one_group))

        def no_front(docs):
            del docs["deployment-front.yaml"]
            docs["kustomization.yaml"][0]["resources"].remove("deployment-front.yaml")
        self.assertIn("expected one Deployment (the front)", self.errors_after(no_front))

        def no_kustomization(docs):
            del docs["kustomization.yaml"]
        self.assertIn("expected one Kustomization", self.errors_after(no_kustomization))

        def autoscaler(docs):
            docs["hpa.yaml"] = [{
                "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "knnd-front"},
                "spec": {"scaleTargetRef": {"apiVersion": "apps/v1",
                                            "kind": "Deployment", "name": "knnd-front"},
                         "maxReplicas": 4}}]
        self.assertIn("unexpected HorizontalPodAutoscaler", self.errors_after(autoscaler))

    def test_detects_a_shard_config_without_kept_versions(self):
        errors = self.errors_after(self.config_change(
            "configmap-shard.yaml", "keep_previous_versions: 1",
            "keep_previous_versions: 0"))
        self.assertIn("ConfigMap knnd-shard-config: keep_previous_versions=0", errors)
        self.assertIn("rule 4", errors)

        self.assertIn("index_poll_interval_ms=0", self.errors_after(self.config_change(
            "configmap-shard.yaml", "index_poll_interval_ms: 30000",
            "index_poll_interval_ms: 0")))

        self.assertIn("ConfigMap knnd-shard-config: a shard server has shard_targets",
                      self.errors_after(self.config_change(
                          "configmap-shard.yaml", "keep_previous_versions: 1",
                          'keep_previous_versions: 1\nshard_targets: "dns:///x:1"')))

    def test_detects_a_shard_service_that_is_not_one_shard(self):
        def service(docs, name):
            return self.doc(docs, "service-shard.yaml", name)

        def one_group(docs):
            service(docs, "knnd-shard-0")["spec"]["selector"]["knnd/replica-group"] = "a"
        errors = self.errors_after(one_group)
        self.assertIn("Service knnd-shard-0: selects ['knnd-shard-a-0'], not every "
                      "replica of shard 0 ['knnd-shard-a-0', 'knnd-shard-b-0']", errors)
        self.assertIn("shard 0: 0 Services select its replicas", errors)

        def twice(docs):
            service(docs, "knnd-shard-1")["spec"]["selector"][POD_INDEX_LABEL] = "0"
        errors = self.errors_after(twice)
        self.assertIn("shard 0: 2 Services select its replicas", errors)
        self.assertIn("shard 1: 0 Services select its replicas", errors)

        def no_such_shard(docs):
            service(docs, "knnd-shard-1")["spec"]["selector"][POD_INDEX_LABEL] = "2"
        self.assertIn("Service knnd-shard-1: selector does not match the pods",
                      self.errors_after(no_such_shard))

        def index_alone(docs):
            del service(docs, "knnd-shard-0")["spec"]["selector"]["app.kubernetes.io/name"]
        self.assertIn("Service knnd-shard-0: selects by apps.kubernetes.io/pod-index "
                      "alone", self.errors_after(index_alone))

        def not_headless(docs):
            del service(docs, "knnd-shard-0")["spec"]["clusterIP"]
        self.assertIn("Service knnd-shard-0: a shard's Service must be headless",
                      self.errors_after(not_headless))

        def port(docs):
            service(docs, "knnd-shard-0")["spec"]["ports"][0]["port"] = 80
        self.assertIn("Service knnd-shard-0: headless, so clients reach the pods at "
                      "port 80", self.errors_after(port))

    def test_detects_shard_targets_that_are_not_the_shard_services(self):
        target = "dns:///knnd-shard-1.search.svc.cluster.local:50051"
        errors = self.errors_after(self.front_config_change(
            f'shard_targets: "{target}"\n', ""))
        self.assertIn("front: shard Service knnd-shard-1 is not in shard_targets",
                      errors)
        self.assertIn("front: 1 shard_targets for 2 shards", errors)

        errors = self.errors_after(self.front_config_change(
            target, "dns:///knnd-shard-0.search.svc.cluster.local:50051"))
        self.assertIn("front: shard_targets name knnd-shard-0 more than once", errors)

        self.assertIn("names knnd-shards, not the Service of one shard",
                      self.errors_after(self.front_config_change(
                          target, "dns:///knnd-shards.search.svc.cluster.local:50051")))

        self.assertIn("is in namespace default, the kustomization's is search",
                      self.errors_after(self.front_config_change(
                          target, target.replace(".search.", ".default."))))

        self.assertIn("dials port 50052, the shards listen on 50051",
                      self.errors_after(self.front_config_change(
                          target, target.replace("50051", "50052"))))

        self.assertIn("is not dns:///SERVICE.NAMESPACE.svc.cluster.local:PORT",
                      self.errors_after(self.front_config_change(
                          target, "knnd-shard-1:50051")))

        def namespace(docs):
            docs["kustomization.yaml"][0]["namespace"] = "other"
        self.assertIn("the kustomization's is other", self.errors_after(namespace))

    def test_detects_a_front_with_an_index(self):
        errors = self.errors_after(self.front_config_change(
            "shard_poll_interval_ms: 1000",
            'shard_poll_interval_ms: 1000\nindex_path: "/index/index.faiss"'))
        self.assertIn("Deployment knnd-front: a front (shard_targets) serves no index",
                      errors)

        def volume(docs):
            pod = self.doc(docs, "deployment-front.yaml", "knnd-front")["spec"][
                "template"]["spec"]
            pod["volumes"].append({"name": "index", "persistentVolumeClaim": {
                "claimName": "knnd-shards", "readOnly": True}})
        self.assertIn("a front (shard_targets) holds no index, but mounts volumes "
                      "['index']", self.errors_after(volume))

    def test_detects_budgets_that_select_no_pod_or_allow_too_much(self):
        def budget(docs, name):
            return self.doc(docs, "pdb.yaml", name)

        def nothing(docs):
            budget(docs, "knnd-shard-1")["spec"]["selector"]["matchLabels"][
                POD_INDEX_LABEL] = "5"
        errors = self.errors_after(nothing)
        self.assertIn("PodDisruptionBudget knnd-shard-1: selects no pod", errors)
        self.assertIn("shard 1: 0 PodDisruptionBudgets, not one", errors)

        def every_shard(docs):
            del budget(docs, "knnd-shard-1")["spec"]["selector"]["matchLabels"][
                POD_INDEX_LABEL]
        self.assertIn("PodDisruptionBudget knnd-shard-1: selects ['knnd-shard-a-0', "
                      "'knnd-shard-a-1', 'knnd-shard-b-0', 'knnd-shard-b-1'], not the "
                      "replicas of one shard", self.errors_after(every_shard))

        def index_alone(docs):
            del budget(docs, "knnd-shard-0")["spec"]["selector"]["matchLabels"][
                "app.kubernetes.io/name"]
        self.assertIn("PodDisruptionBudget knnd-shard-0: selects by "
                      "apps.kubernetes.io/pod-index alone", self.errors_after(index_alone))

        def max_unavailable(docs):
            spec = budget(docs, "knnd-shard-0")["spec"]
            del spec["minAvailable"]
            spec["maxUnavailable"] = 1
        self.assertIn("knnd-shard-0: a shard's budget needs an integer minAvailable",
                      self.errors_after(max_unavailable))

        def percent(docs):
            budget(docs, "knnd-shard-0")["spec"]["minAvailable"] = "50%"
        self.assertIn("needs an integer minAvailable", self.errors_after(percent))

        def all_of_them(docs):
            budget(docs, "knnd-shard-0")["spec"]["minAvailable"] = 2
        self.assertIn("knnd-shard-0: minAvailable 2 with 2 replica groups",
                      self.errors_after(all_of_them))

        def front(docs):
            budget(docs, "knnd-front")["spec"]["selector"]["matchLabels"] = {
                "app.kubernetes.io/name": "knnd"}
        errors = self.errors_after(front)
        self.assertIn("PodDisruptionBudget knnd-front: selects no pod", errors)
        self.assertIn("no PodDisruptionBudget selects exactly the front's pods", errors)

        def one_front(docs):
            self.doc(docs, "deployment-front.yaml", "knnd-front")["spec"]["replicas"] = 1
        self.assertIn("the front has fewer than 2 replicas", self.errors_after(one_front))

    def test_detects_a_missing_front_service_or_scrape_route(self):
        def no_headless(docs):
            docs["service-front.yaml"] = [
                d for d in docs["service-front.yaml"]
                if d["metadata"]["name"] != "knnd-front-headless"]
        self.assertIn("the front needs a ClusterIP and a headless Service",
                      self.errors_after(no_headless))

        def no_annotations(docs):
            self.group(docs, "knnd-shard-a")["spec"]["template"]["metadata"][
                "annotations"].clear()
        errors = self.errors_after(no_annotations)
        self.assertIn("no scrape route: StatefulSet knnd-shard-a's pods", errors)

    def test_detects_a_resource_missing_from_the_kustomization(self):
        def change(docs):
            docs["kustomization.yaml"][0]["resources"].remove("pdb.yaml")
        self.assertIn("pdb.yaml is not in resources", self.errors_after(change))


class BucketManifestTest(unittest.TestCase):
    """deploy/k8s-bucket, the overlay rendered onto deploy/k8s: every check
    of deploy/k8s, and those of versions synced from a bucket. Each negative
    test breaks a copy of the overlay and expects its check to fail."""

    @classmethod
    def setUpClass(cls):
        cls.config_pb2 = config_module()
        cls.dir = os.path.join(ARGS.source_dir, "deploy", "k8s-bucket")
        cls.docs = load_dir(cls.dir)
        cls.base = load_dir(os.path.join(ARGS.source_dir, "deploy", "k8s"))

    def errors_after(self, change):
        docs = copy.deepcopy(self.docs)
        change(docs)
        return "\n".join(check_bucket_manifests(docs, self.base, self.config_pb2))

    def pod(self, docs):
        return docs["deployment-patch.yaml"][0]["spec"]["template"]["spec"]

    def sync(self, docs, init=False):
        return self.pod(docs)["initContainers" if init else "containers"][0]

    def config_change(self, old, new):
        def change(docs):
            data = docs["configmap-patch.yaml"][0]["data"]
            self.assertIn(old, data["knnd.textproto"])
            data["knnd.textproto"] = data["knnd.textproto"].replace(old, new)
        return change

    def set_arg(self, container, flag, value):
        args = container["args"]
        args[args.index(flag) + 1] = value

    def test_repository_manifests_pass(self):
        self.assertEqual(sorted(self.docs), ["configmap-patch.yaml",
                                             "deployment-patch.yaml",
                                             "kustomization.yaml"])
        self.assertEqual(check_bucket_manifests(self.docs, self.base,
                                                self.config_pb2), [])

    @unittest.skipUnless(shutil.which("kubectl"), "kubectl is not installed")
    def test_kustomize_renders_what_the_checks_saw(self):
        out = subprocess.run(["kubectl", "kustomize", self.dir], check=True,
                             capture_output=True, text=True, timeout=120).stdout
        by_kind = {d["kind"]: d for d in yaml.safe_load_all(out) if d}
        rendered, errors = render_overlay(self.docs, self.base)
        self.assertEqual(errors, [])
        mine = {d["kind"]: d for docs in rendered.values() for d in docs}
        self.assertEqual(by_kind["ConfigMap"]["data"], mine["ConfigMap"]["data"])
        pods = [d["Deployment"]["spec"]["template"]["spec"] for d in (by_kind, mine)]
        for key in ("initContainers", "containers"):
            self.assertEqual(*[sorted(c["name"] for c in p[key]) for p in pods])
        self.assertEqual(*[sorted(p["volumes"], key=lambda v: v["name"]) for p in pods])
        sync = [c for c in pods[0]["containers"] if c["name"] == "bucket-sync"][0]
        self.assertEqual(sync["image"], "registry.example.com/knnd-bucket-sync:0.1.0")

    def test_the_checks_of_deploy_k8s_still_run(self):
        def writable(docs):
            self.pod(docs)["containers"].append({"name": "knnd", "volumeMounts": [
                {"name": "index", "mountPath": "/index", "readOnly": False}]})
        self.assertIn("the index volume is not mounted readOnly",
                      self.errors_after(writable))

        def no_object(docs):
            docs["configmap-patch.yaml"][0]["metadata"]["name"] = "other"
        self.assertIn("configmap-patch.yaml: ConfigMap other is not one object",
                      self.errors_after(no_object))

        def unlisted(docs):
            docs["kustomization.yaml"][0]["patches"].pop()
        self.assertIn("are not the files present", self.errors_after(unlisted))

    def test_detects_credentials_outside_a_secret_or_in_knnd(self):
        def literal(docs):
            self.sync(docs)["env"].append({
                "name": "RCLONE_CONFIG_BUCKET_SECRET_ACCESS_KEY", "value": "x"})
        self.assertIn("container bucket-sync: RCLONE_CONFIG_BUCKET_SECRET_ACCESS_KEY "
                      "has a literal value", self.errors_after(literal))

        def to_knnd(docs):
            self.pod(docs)["containers"].append({"name": "knnd", "envFrom": [
                {"secretRef": {"name": "knnd-bucket-credentials"}}]})
        self.assertIn("container knnd: takes a Secret's values",
                      self.errors_after(to_knnd))

        self.assertIn("ConfigMap knnd-config: knnd.textproto holds rclone settings",
                      self.errors_after(self.config_change(
                          "log_level", "# RCLONE_CONFIG_BUCKET_ACCESS_KEY_ID=a\nlog_level")))

        def none(docs):
            for c in (self.sync(docs), self.sync(docs, init=True)):
                del c["envFrom"]
                c["env"] = [e for e in c["env"] if not e["name"].endswith("ENV_AUTH")]
        self.assertIn("container bucket-init: no credentials", self.errors_after(none))

        def unnamed(docs):
            self.set_arg(self.sync(docs), "--remote", "other:knnd-versions/prod")
        errors = self.errors_after(unnamed)
        self.assertIn("remote 'other' has no RCLONE_CONFIG_OTHER_TYPE", errors)
        self.assertIn("the init container and the sidecar sync different remotes",
                      errors)

    def test_detects_a_volume_that_is_not_a_bounded_empty_dir(self):
        def claim(docs):
            del self.pod(docs)["volumes"][0]["persistentVolumeClaim"]
        errors = self.errors_after(claim)
        self.assertIn("mounts PersistentVolumeClaims ['index']", errors)

        def unbounded(docs):
            del self.pod(docs)["volumes"][0]["emptyDir"]["sizeLimit"]
        self.assertIn("is not an emptyDir with a sizeLimit",
                      self.errors_after(unbounded))

        def over(docs):
            self.set_arg(self.sync(docs), "--disk_budget_bytes", str(16 << 30))
        self.assertIn("--disk_budget_bytes 17179869184 exceeds the volume's "
                      "sizeLimit 8Gi", self.errors_after(over))

        def read_only(docs):
            self.sync(docs)["volumeMounts"][0]["readOnly"] = True
        self.assertIn("container bucket-sync: mounts /index/versions's volume "
                      "readOnly", self.errors_after(read_only))

        def no_tmp(docs):
            self.sync(docs)["volumeMounts"].pop()
        self.assertIn("container bucket-sync: no volume at /tmp",
                      self.errors_after(no_tmp))

    def test_detects_a_sync_that_is_not_knnds_or_unbounded(self):
        def elsewhere(docs):
            self.set_arg(self.sync(docs, init=True), "--versions_dir", "/index/v")
        self.assertIn("container bucket-init: --versions_dir /index/v is not "
                      "knnd's index /index/versions", self.errors_after(elsewhere))

        def unlimited(docs):
            args = self.sync(docs)["args"]
            del args[args.index("--bwlimit"):args.index("--bwlimit") + 2]
        self.assertIn("container bucket-sync: --bwlimit is not set",
                      self.errors_after(unlimited))

        def keep_one(docs):
            self.set_arg(self.sync(docs), "--keep", "1")
        self.assertIn("--keep 1 would remove the version serving",
                      self.errors_after(keep_one))

        def no_limits(docs):
            del self.sync(docs)["resources"]["limits"]["memory"]
        self.assertIn("container bucket-sync: no memory limit",
                      self.errors_after(no_limits))

        def writable_root(docs):
            self.sync(docs, init=True)["securityContext"]["readOnlyRootFilesystem"] = False
        self.assertIn("container bucket-init: readOnlyRootFilesystem is not true",
                      self.errors_after(writable_root))

    def test_detects_a_missing_init_container_sidecar_or_poll(self):
        def no_init(docs):
            del self.pod(docs)["initContainers"]
        self.assertIn("expected one init container running the sync with --once",
                      self.errors_after(no_init))

        def no_sidecar(docs):
            self.sync(docs)["args"].append("--once")
        self.assertIn("expected one sidecar running the sync without --once",
                      self.errors_after(no_sidecar))

        def no_interval(docs):
            args = self.sync(docs)["args"]
            i = args.index("--poll_interval_s")
            del args[i:i + 2]
        self.assertIn("--poll_interval_s is not set", self.errors_after(no_interval))

        self.assertIn("index_poll_interval_ms=0: knnd never finds",
                      self.errors_after(self.config_change(
                          "index_poll_interval_ms: 2000", "index_poll_interval_ms: 0")))


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()

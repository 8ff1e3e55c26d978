#!/usr/bin/python3
"""Offline checks of deploy/k8s: no cluster, nothing downloaded.

Every manifest parses (duplicate keys refused) and every field is checked
against the Kubernetes API types of python3-kubernetes (unknown fields,
wrong types, missing required fields). Debian 12's python3-kubernetes 22.6
is the Kubernetes 1.22 API: the few types used here that are newer
(Probe.grpc, Kubernetes 1.24; autoscaling/v2, 1.23, whose fields are those
of v2beta2) and the Prometheus Operator's ServiceMonitor are described in
EXTRA_TYPES below. Then the manifests are checked against each other and
against knnd's config in the ConfigMap, parsed with the config.proto schema:
ports, probes, memory limit, read-only index, drain timing, security
context, selectors, the kustomization's resource list, and that metrics are
scraped by exactly one route (the pods' prometheus.io/* annotations, the
default, or the opt-in ServiceMonitor), never both.

  manifests_test.py --source-dir . [unittest args]
"""
import argparse
import copy
import functools
import os
import re
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
                       "labels": "list[object]", "namespace": "str"},
                      {"resources"}),
}
# Fields added to a model's type after Kubernetes 1.22.
EXTRA_FIELDS = {"V1Probe": {"grpc": "GRPCAction"}}
KINDS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2beta2HorizontalPodAutoscaler",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "ServiceMonitor",
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"): "Kustomization",
}
PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float),
              "datetime": str, "date": str}
HEALTH_SERVICES = ("", "knnd.v1.KnnService")
MIN_STARTUP_SECONDS = 300
# Files of deploy/k8s that the default kustomization leaves out on purpose:
# the ServiceMonitor is the opt-in second scrape route (kustomization.yaml).
OPTIONAL_RESOURCES = {"servicemonitor.yaml"}
PROMETHEUS_ANNOTATION_PREFIX = "prometheus.io/"
PROCESS_BASELINE_BYTES = 100 << 20
# After the drain knnd closes its listeners (GOAWAY, held answers) in about
# a second; the grace period leaves room for it.
CLOSE_MARGIN_S = 2


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


def load_dir(directory):
    """{file name: [documents]} of every .yaml file in `directory`."""
    docs = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(directory, name)) as f:
                docs[name] = [d for d in yaml.load_all(f, UniqueKeyLoader) if d]
    return docs


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


def check_manifests(docs, config_pb2):
    """All the errors found in `docs` ({file: [documents]}), as strings."""
    from google.protobuf import text_format
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
    listed = set(kustomization["resources"])
    present = {n for n in docs if n != "kustomization.yaml"}
    for missing in sorted(present - listed - OPTIONAL_RESOURCES):
        errors.append(f"kustomization.yaml: {missing} is not in resources")
    for extra in sorted(listed - present):
        errors.append(f"kustomization.yaml: resource {extra} does not exist")

    _, deployment = objects["Deployment"][0]
    pod = deployment["spec"]["template"]
    pod_labels = pod["metadata"].get("labels", {})
    if not selects(deployment["spec"]["selector"].get("matchLabels"), pod_labels):
        errors.append("Deployment: selector does not match the pod template labels")
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    if "knnd" not in containers:
        return errors + ["Deployment: no container named knnd"]
    c = containers["knnd"]

    # knnd's config, as knnd will parse it.
    _, configmap = objects["ConfigMap"][0]
    args = c.get("args", [])
    config_path = args[args.index("--config") + 1] if "--config" in args else None
    if config_path is None:
        return errors + ["Deployment: knnd has no --config argument"]
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    config_key = None
    for vname, mount in mounts.items():
        source = volumes.get(vname, {}).get("configMap", {})
        if source.get("name") == configmap["metadata"]["name"] and \
                config_path.startswith(mount["mountPath"].rstrip("/") + "/"):
            config_key = config_path[len(mount["mountPath"].rstrip("/")) + 1:]
    if config_key not in configmap.get("data", {}):
        return errors + [f"Deployment: --config {config_path} is not a key of "
                         f"ConfigMap {configmap['metadata']['name']} mounted there"]
    config = config_pb2.ServerConfig()
    try:
        text_format.Parse(configmap["data"][config_key], config)
    except text_format.ParseError as e:
        return errors + [f"ConfigMap {config_key}: {e}"]
    grpc_port = port_of(config.listen_address)
    metrics_port = port_of(config.metrics_listen_address)

    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if ports.get("grpc") != grpc_port:
        errors.append(f"Deployment: containerPort grpc={ports.get('grpc')} but "
                      f"listen_address is {config.listen_address}")
    if ports.get("metrics") != metrics_port:
        errors.append(f"Deployment: containerPort metrics={ports.get('metrics')} "
                      f"but metrics_listen_address is {config.metrics_listen_address}")

    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c.get(probe_name)
        if probe is None:
            errors.append(f"Deployment: {probe_name} missing")
            continue
        handlers = set(probe) & {"grpc", "exec", "httpGet", "tcpSocket"}
        if handlers != {"grpc"}:
            errors.append(f"Deployment: {probe_name} must be a gRPC probe, has "
                          f"{sorted(handlers)}")
            continue
        if probe["grpc"]["port"] != grpc_port:
            errors.append(f"Deployment: {probe_name} grpc.port="
                          f"{probe['grpc']['port']}, knnd listens on {grpc_port}")
        if probe["grpc"].get("service", "") not in HEALTH_SERVICES:
            errors.append(f"Deployment: {probe_name} asks for health service "
                          f"{probe['grpc']['service']!r}, knnd answers {HEALTH_SERVICES}")
    startup = c.get("startupProbe", {})
    startup_s = startup.get("failureThreshold", 3) * startup.get("periodSeconds", 10)
    if startup_s < MIN_STARTUP_SECONDS:
        errors.append(f"Deployment: startupProbe allows {startup_s} s, less than "
                      f"{MIN_STARTUP_SECONDS} s for loading a large index")

    resources = c.get("resources", {})
    limit = resources.get("limits", {}).get("memory")
    request = resources.get("requests", {}).get("memory")
    if limit is None:
        errors.append("Deployment: knnd has no memory limit")
    else:
        floor = config.max_inflight_bytes + PROCESS_BASELINE_BYTES
        if memory_bytes(limit) < floor:
            errors.append(f"Deployment: memory limit {limit} is below "
                          f"max_inflight_bytes + {PROCESS_BASELINE_BYTES >> 20} MiB")
        if request is None or memory_bytes(request) > memory_bytes(limit):
            errors.append("Deployment: memory request missing or above the limit")
    if "cpu" not in resources.get("requests", {}):
        errors.append("Deployment: no cpu request (the HPA scales on it)")

    index_dir = os.path.dirname(config.index_path)
    index_mount = [m for m in mounts.values()
                   if index_dir == m["mountPath"].rstrip("/")
                   or index_dir.startswith(m["mountPath"].rstrip("/") + "/")]
    if not index_mount:
        errors.append(f"Deployment: no volume mounted at {index_dir} (index_path)")
    elif not index_mount[0].get("readOnly"):
        errors.append("Deployment: the index volume is not mounted readOnly")
    else:
        pvc = volumes.get(index_mount[0]["name"], {}).get("persistentVolumeClaim")
        if pvc is not None and not pvc.get("readOnly"):
            errors.append("Deployment: the index PersistentVolumeClaim is not readOnly")

    # knnd waits shutdown_delay_ms itself (health NOT_SERVING meanwhile); a
    # preStop sleep would only add to it, with health still SERVING.
    pre_stop = c.get("lifecycle", {}).get("preStop")
    if pre_stop is not None:
        errors.append(f"Deployment: a preStop hook ({pre_stop}) delays SIGTERM "
                      "with health still SERVING; knnd's shutdown_delay_ms "
                      "does that wait")
    if config.shutdown_delay_ms < 1000:
        errors.append(f"Deployment: shutdown_delay_ms={config.shutdown_delay_ms} "
                      "leaves Kubernetes no time to remove the endpoint "
                      "before the drain (at least 1000)")
    needed = (config.shutdown_delay_ms + config.drain_grace_period_ms) / 1000
    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    if grace <= needed + CLOSE_MARGIN_S:
        errors.append(f"Deployment: terminationGracePeriodSeconds={grace} is "
                      f"not above shutdown_delay_ms {config.shutdown_delay_ms} + "
                      f"drain_grace_period_ms {config.drain_grace_period_ms} + "
                      f"{CLOSE_MARGIN_S} s to close")

    pod_sc = pod["spec"].get("securityContext", {})
    sc = c.get("securityContext", {})
    if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
        errors.append("Deployment: runAsNonRoot is not set")
    if sc.get("readOnlyRootFilesystem") is not True:
        errors.append("Deployment: readOnlyRootFilesystem is not true")
    if sc.get("allowPrivilegeEscalation") is not False:
        errors.append("Deployment: allowPrivilegeEscalation is not false")
    if sc.get("privileged"):
        errors.append("Deployment: container is privileged")
    if "ALL" not in sc.get("capabilities", {}).get("drop", []):
        errors.append("Deployment: capabilities are not dropped (drop: [ALL])")

    annotations = pod["metadata"].get("annotations", {})
    annotation_route = any(k.startswith(PROMETHEUS_ANNOTATION_PREFIX)
                           for k in annotations)
    if annotation_route and (
            annotations.get("prometheus.io/scrape") != "true" or
            annotations.get("prometheus.io/port") != str(metrics_port) or
            annotations.get("prometheus.io/path") != "/metrics"):
        errors.append(f"Deployment: prometheus.io annotations must say scrape "
                      f"\"true\", port \"{metrics_port}\", path /metrics")
    if config.max_connection_age_ms == 0:
        errors.append("ConfigMap: max_connection_age_ms is 0: connections never rebalance")

    services = {doc["metadata"]["name"]: doc for _, doc in objects["Service"]}
    headless = [s for s in services.values() if s["spec"].get("clusterIP") == "None"]
    if len(headless) != 1:
        errors.append("expected one headless Service (clusterIP: None)")
    for name, svc in services.items():
        if not selects(svc["spec"].get("selector"), pod_labels):
            errors.append(f"Service {name}: selector does not match the pods")
        for p in svc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            target = ports.get(target) if isinstance(target, str) else target
            if p.get("name") == "grpc" and target != grpc_port:
                errors.append(f"Service {name}: port grpc targets {target}, not {grpc_port}")
            if p.get("name") == "metrics" and target != metrics_port:
                errors.append(f"Service {name}: port metrics targets {target}, "
                              f"not {metrics_port}")
        if not any(p.get("name") == "grpc" for p in svc["spec"]["ports"]):
            errors.append(f"Service {name}: no port named grpc")

    monitor_file, monitor = objects["ServiceMonitor"][0]
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


class ManifestTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        proto = os.path.join(ARGS.source_dir, "proto")
        subprocess.run(["protoc", f"--proto_path={proto}",
                        f"--python_out={cls.tmp.name}",
                        os.path.join(proto, "knnd/v1/config.proto")], check=True)
        sys.path.insert(0, cls.tmp.name)
        from knnd.v1 import config_pb2
        cls.config_pb2 = config_pb2
        cls.dir = os.path.join(ARGS.source_dir, "deploy", "k8s")
        cls.docs = load_dir(cls.dir)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

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
        self.assertIn("livenessProbe must be a gRPC probe", self.errors_after(http))

        def port(docs):
            self.container(docs)["readinessProbe"]["grpc"]["port"] = 9090
        self.assertIn("readinessProbe grpc.port=9090", self.errors_after(port))

        def service(docs):
            self.container(docs)["startupProbe"]["grpc"]["service"] = "knnd"
        self.assertIn("health service 'knnd'", self.errors_after(service))

        def short(docs):
            self.container(docs)["startupProbe"]["failureThreshold"] = 3
        self.assertIn("startupProbe allows 15 s", self.errors_after(short))

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


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()

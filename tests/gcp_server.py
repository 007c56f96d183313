"""A small Compute Engine (v1) REST server for the GCP provider's tests.

No Compute Engine emulator exists, so this answers the part of the API that kplan uses with the
API's own JSON shapes, for the real ``google.cloud.compute_v1`` clients pointed at it through
``ClientOptions(api_endpoint=...)``:

- instances: insert (with ``requestId`` de-duplication), get, list, aggregatedList (with
  ``filter``, ``maxResults``/``pageToken``), delete;
- zone and global operations: get, wait, list (with ``filter``);
- firewalls: insert, get, list, delete;
- errors as the API's error body ``{"error": {"code", "message", "errors": [{"reason"}]}}``:
  404 ``notFound``, 409 ``alreadyExists``, 400 ``invalid``, and any injected with :meth:`fail`.

Like the API, it checks what the client sends (names, labels, spot scheduling, time limits:
``maxRunDuration`` 30 s to 120 days with a termination action, CIDRs) and rejects a bad request
with 400, so a test that passes here sends requests GCP would accept.
Test controls: :meth:`FakeCompute.preempt` (what GCP does to a spot VM: status TERMINATED, or
gone with ``instanceTerminationAction=DELETE``, plus a ``compute.instances.preempted``
operation), :meth:`FakeCompute.run_out` (a VM reached its ``maxRunDuration``), :meth:`fail`
(an HTTP error), :meth:`fail_insert` (an insert operation that ends with an error, as a
stockout does), and ``requests`` (every request with its JSON body).
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tests.gcp_http import ApiError, Json, lookup, matches, parse_filter, serve_http

API = "https://www.googleapis.com/compute/v1"
NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
LABEL_KEY_RE = re.compile(r"[a-z][-_a-z0-9]{0,62}")
LABEL_VALUE_RE = re.compile(r"[-_a-z0-9]{0,63}")
PREEMPTED = "compute.instances.preempted"


@dataclass
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    query: dict[str, str]
    body: Json | None


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    error: ApiError
    times: int
    after: bool  # the request is carried out, then the reply is this error (a lost reply)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class FakeCompute:
    """State and behaviour; :meth:`serve` puts it behind HTTP on 127.0.0.1."""

    def __init__(self, *, boot_delay_s: float = 0.0, op_delay_s: float = 0.0) -> None:
        self.boot_delay_s, self.op_delay_s = boot_delay_s, op_delay_s
        self.page_size = 500
        self.lock = threading.RLock()
        self.instances: dict[tuple[str, str, str], Json] = {}  # (project, zone, name)
        self.firewalls: dict[tuple[str, str], Json] = {}  # (project, name)
        self.operations: dict[tuple[str, str, str], Json] = {}  # (project, zone|"global", name)
        self.requests: list[Seen] = []
        self._faults: list[Fault] = []
        self._insert_errors: list[tuple[re.Pattern[str], str, str, int]] = []
        self._by_request_id: dict[str, Json] = {}
        self._pending: dict[tuple[str, str, str], tuple[float, Any]] = {}  # op -> (done at, effect)
        self._ready: dict[tuple[str, str, str], float] = {}  # instance -> running at
        self._ids = itertools.count(4_100_000_000_000_000_001, 7919)
        # zone -> MachineType / AcceleratorType resources (see add_machine_type)
        self.machine_types: dict[str, list[Json]] = {}
        self.accelerator_types: dict[str, list[Json]] = {}
        self._ips = itertools.count(2)

    # --- test controls -------------------------------------------------------------------------

    def fail(
        self,
        method: str,
        path: str,
        code: int,
        reason: str,
        message: str,
        times: int = 1,
        *,
        after: bool = False,
    ) -> None:
        """The next ``times`` requests ``method`` on a path matching regex ``path`` fail; with
        ``after``, each is carried out first and only its reply is the error."""
        error = ApiError(code, reason, message)
        self._faults.append(Fault(method, re.compile(path), error, times, after))

    def fail_insert(self, name: str, code: str, message: str, http_status: int = 503) -> None:
        """Inserts of instances whose name matches regex ``name`` are accepted, then their
        operation ends DONE with ``error.errors[0].code == code`` (no instance is made)."""
        self._insert_errors.append((re.compile(name), code, message, http_status))

    def clear_insert_failures(self) -> None:
        """Inserts succeed again (``fail_insert``'s rules are dropped)."""
        self._insert_errors.clear()

    def add_machine_type(
        self, zone: str, name: str, cpus: int, memory_mb: int, gpus: tuple[str, int] | None = None
    ) -> None:
        """A machine type offered in ``zone`` (``gpus``: bundled accelerator type and count)."""
        mt: Json = {
            "kind": "compute#machineType",
            "id": str(next(self._ids)),
            "name": name,
            "description": f"{cpus} vCPUs, {memory_mb / 1024:g} GB RAM",
            "guestCpus": cpus,
            "memoryMb": memory_mb,
            "maximumPersistentDisks": 128,
            "zone": zone,
            "selfLink": f"{API}/projects/p/zones/{zone}/machineTypes/{name}",
            "isSharedCpu": False,
        }
        if gpus is not None:
            mt["accelerators"] = [
                {"guestAcceleratorType": gpus[0], "guestAcceleratorCount": gpus[1]}
            ]
        self.machine_types.setdefault(zone, []).append(mt)

    def add_accelerator_type(self, zone: str, name: str, description: str, max_cards: int) -> None:
        self.accelerator_types.setdefault(zone, []).append(
            {
                "kind": "compute#acceleratorType",
                "id": str(next(self._ids)),
                "name": name,
                "description": description,
                "zone": zone,
                "maximumCardsPerInstance": max_cards,
                "selfLink": f"{API}/projects/p/zones/{zone}/acceleratorTypes/{name}",
            }
        )

    def aggregated_types(self, project: str, kind: str, query: dict[str, str]) -> Json:
        """``aggregated/machineTypes`` or ``aggregated/acceleratorTypes``: one page, every zone
        (a zone with no match gets the API's NO_RESULTS_ON_SCOPE warning)."""
        terms = parse_filter(query.get("filter", ""))
        store = self.machine_types if kind == "machineTypes" else self.accelerator_types
        items: Json = {}
        for zone, resources in sorted(store.items()):
            hits = [r for r in resources if matches(r, terms)]
            if hits:
                items[f"zones/{zone}"] = {kind: hits}
            else:
                items[f"zones/{zone}"] = {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": f"There are no results for scope 'zones/{zone}' on this page.",
                        "data": [{"key": "scope", "value": f"zones/{zone}"}],
                    }
                }
        return {
            "kind": f"compute#{kind[0].lower()}{kind[1:-1]}AggregatedList",
            "id": f"projects/{project}/aggregated/{kind}",
            "items": items,
            "selfLink": f"{API}/projects/{project}/aggregated/{kind}",
        }

    def preempt(self, name: str) -> Json:
        """Preempt spot instance ``name``: the instance stops (or, with termination action
        DELETE, disappears) and a ``compute.instances.preempted`` operation records it."""
        with self.lock:
            key = next(k for k in self.instances if k[2] == name)
            inst = self.instances[key]
            if lookup(inst, "scheduling.provisioningModel") != "SPOT":
                raise ValueError(f"{name} is not a spot instance")
            project, zone, _ = key
            if lookup(inst, "scheduling.instanceTerminationAction") == "DELETE":
                del self.instances[key]
            else:
                inst.update(status="TERMINATED", lastStopTimestamp=_now())
            op = self._operation(project, zone, PREEMPTED, inst, done=True, user="system")
            op["statusMessage"] = "Instance was preempted."
            return op

    def run_out(self, name: str) -> None:
        """Instance ``name`` reached its ``maxRunDuration``: GCP applies its termination action
        (DELETE: it disappears; STOP: it stops)."""
        with self.lock:
            key = next(k for k in self.instances if k[2] == name)
            inst = self.instances[key]
            if lookup(inst, "scheduling.maxRunDuration") is None:
                raise ValueError(f"{name} has no time limit")
            if lookup(inst, "scheduling.instanceTerminationAction") == "DELETE":
                del self.instances[key]
            else:
                inst.update(status="TERMINATED", lastStopTimestamp=_now())

    def find(self, name: str) -> Json | None:
        with self.lock:
            return next((v for k, v in self.instances.items() if k[2] == name), None)

    def bodies(self, method: str, path_end: str) -> list[Json]:
        """The JSON bodies of the requests ``method`` whose path ends with ``path_end``."""
        return [s.body for s in self.requests if s.method == method and s.path.endswith(path_end)]  # type: ignore[misc]

    # --- resources -----------------------------------------------------------------------------

    def _operation(
        self, project: str, scope: str, kind: str, target: Json, *, done: bool, user: str
    ) -> Json:
        name = f"operation-{int(time.time() * 1000)}-{next(self._ids):x}"
        where = "global" if scope == "global" else f"zones/{scope}"
        op: Json = {
            "kind": "compute#operation",
            "id": str(next(self._ids)),
            "name": name,
            "operationType": kind,
            "targetLink": target["selfLink"],
            "targetId": target["id"],
            "status": "DONE" if done else "RUNNING",
            "user": user,
            "progress": 100 if done else 0,
            "insertTime": _now(),
            "startTime": _now(),
            "selfLink": f"{API}/projects/{project}/{where}/operations/{name}",
        }
        if done:
            op["endTime"] = _now()
        if scope != "global":
            op["zone"] = f"{API}/projects/{project}/zones/{scope}"
        self.operations[(project, scope, name)] = op
        return op

    def _start(self, project: str, scope: str, kind: str, target: Json, effect: Any) -> Json:
        """An operation that finishes (running ``effect``) after ``op_delay_s``."""
        op = self._operation(project, scope, kind, target, done=False, user="kplan-test@example")
        self._pending[(project, scope, op["name"])] = (time.monotonic() + self.op_delay_s, effect)
        self._tick()
        return op

    def _tick(self) -> None:
        now = time.monotonic()
        for key, (at, effect) in list(self._pending.items()):
            if now >= at:
                del self._pending[key]
                op = self.operations[key]
                op.update(status="DONE", progress=100, endTime=_now())
                if effect is not None:
                    effect(op)
        for key, at in list(self._ready.items()):
            inst = self.instances.get(key)
            if inst is None or inst["status"] not in ("PROVISIONING", "STAGING"):
                del self._ready[key]
            elif now >= at:
                inst.update(status="RUNNING", lastStartTimestamp=_now())
                del self._ready[key]

    def _instance(self, project: str, zone: str, name: str) -> Json:
        inst = self.instances.get((project, zone, name))
        if inst is None:
            where = f"projects/{project}/zones/{zone}/instances/{name}"
            raise ApiError(404, "notFound", f"The resource '{where}' was not found")
        return inst

    def insert_instance(self, project: str, zone: str, body: Json, request_id: str) -> Json:
        if request_id and request_id in self._by_request_id:
            return self._by_request_id[request_id]
        name = str(body.get("name", ""))
        _check_instance(body)
        if (project, zone, name) in self.instances:
            where = f"projects/{project}/zones/{zone}/instances/{name}"
            raise ApiError(409, "alreadyExists", f"The resource '{where}' already exists")
        link = f"{API}/projects/{project}/zones/{zone}/instances/{name}"
        inst = _instance_resource(body, link, str(next(self._ids)), next(self._ips))
        inst["zone"] = f"{API}/projects/{project}/zones/{zone}"
        failure = next((f for f in self._insert_errors if f[0].fullmatch(name)), None)
        if failure is None:
            self.instances[(project, zone, name)] = inst
            self._ready[(project, zone, name)] = time.monotonic() + self.boot_delay_s
            op = self._start(project, zone, "insert", inst, None)
        else:
            _, code, message, status = failure

            def fail(op: Json) -> None:
                op["error"] = {"errors": [{"code": code, "message": message}]}
                op.update(httpErrorStatusCode=status, httpErrorMessage="SERVICE UNAVAILABLE")

            op = self._start(project, zone, "insert", inst, fail)
        if request_id:
            self._by_request_id[request_id] = op
        return op

    def delete_instance(self, project: str, zone: str, name: str) -> Json:
        inst = self._instance(project, zone, name)
        inst["status"] = "STOPPING"
        return self._start(
            project, zone, "delete", inst, lambda _: self.instances.pop((project, zone, name), 0)
        )

    def aggregated(self, project: str, query: dict[str, str]) -> Json:
        terms = parse_filter(query.get("filter", ""))
        size = int(query.get("maxResults", self.page_size))
        start = int(query.get("pageToken", "0") or 0)
        hits = sorted(
            (k, v) for k, v in self.instances.items() if k[0] == project and matches(v, terms)
        )
        page = hits[start : start + size]
        items: Json = {}
        for (_, zone, _), inst in page:
            items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(inst)
        for zone in sorted({k[1] for k in self.instances} - {k[1] for k, _ in page}):
            warning = {
                "code": "NO_RESULTS_ON_PAGE",
                "message": f"There are no results for scope 'zones/{zone}' on this page.",
                "data": [{"key": "scope", "value": f"zones/{zone}"}],
            }
            items[f"zones/{zone}"] = {"warning": warning}
        out: Json = {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{project}/aggregated/instances",
            "items": items,
            "selfLink": f"{API}/projects/{project}/aggregated/instances",
        }
        if start + size < len(hits):
            out["nextPageToken"] = str(start + size)
        return out

    def insert_firewall(self, project: str, body: Json, request_id: str) -> Json:
        if request_id and request_id in self._by_request_id:
            return self._by_request_id[request_id]
        name = str(body.get("name", ""))
        fw = _firewall_resource(project, body)
        if (project, name) in self.firewalls:
            where = f"projects/{project}/global/firewalls/{name}"
            raise ApiError(409, "alreadyExists", f"The resource '{where}' already exists")
        fw.update(id=str(next(self._ids)), creationTimestamp=_now())
        self.firewalls[(project, name)] = fw
        op = self._start(project, "global", "insert", fw, None)
        if request_id:
            self._by_request_id[request_id] = op
        return op

    def _firewall(self, project: str, name: str) -> Json:
        fw = self.firewalls.get((project, name))
        if fw is None:
            where = f"projects/{project}/global/firewalls/{name}"
            raise ApiError(404, "notFound", f"The resource '{where}' was not found")
        return fw

    def _op(self, project: str, scope: str, name: str) -> Json:
        op = self.operations.get((project, scope, name))
        if op is None:
            where = "global" if scope == "global" else f"zones/{scope}"
            raise ApiError(
                404,
                "notFound",
                f"The resource 'projects/{project}/{where}/operations/{name}' was not found",
            )
        return op

    def wait_op(self, project: str, scope: str, name: str) -> Json:
        """Like the API's wait: return when DONE, or after a deadline (here 2 s) when not."""
        deadline = time.monotonic() + 2.0
        while True:
            with self.lock:
                self._tick()
                op = self._op(project, scope, name)
                if op["status"] == "DONE" or time.monotonic() > deadline:
                    return op
            time.sleep(0.005)

    def list_ops(self, project: str, scope: str, query: dict[str, str]) -> Json:
        terms = parse_filter(query.get("filter", ""))
        ops = [v for k, v in self.operations.items() if k[:2] == (project, scope)]
        return {"kind": "compute#operationList", "items": [o for o in ops if matches(o, terms)]}

    # --- HTTP ----------------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, str], body: Json | None) -> Json:
        self.requests.append(Seen(method, path, query, body))
        for fault in self._faults:
            if fault.method == method and fault.path.search(path) and fault.times > 0:
                fault.times -= 1
                if fault.after:
                    self._route(method, path, query, body)
                raise fault.error
        return self._route(method, path, query, body)

    def _route(self, method: str, path: str, query: dict[str, str], body: Json | None) -> Json:
        p = r"/compute/v1/projects/(?P<p>[^/]+)"
        z = p + r"/zones/(?P<z>[^/]+)"
        rid = query.get("requestId", "")
        doc = body or {}
        routes: list[tuple[str, str, Any]] = [
            ("POST", z + "/instances", lambda m: self.insert_instance(m["p"], m["z"], doc, rid)),
            ("GET", z + "/instances/(?P<n>[^/]+)", lambda m: self._instance(*m.groups())),
            ("DELETE", z + "/instances/(?P<n>[^/]+)", lambda m: self.delete_instance(*m.groups())),
            ("GET", z + "/instances", lambda m: self._list(m["p"], m["z"], query)),
            ("GET", p + "/aggregated/instances", lambda m: self.aggregated(m["p"], query)),
            (
                "GET",
                p + "/aggregated/(?P<k>machineTypes|acceleratorTypes)",
                lambda m: self.aggregated_types(m["p"], m["k"], query),
            ),
            ("GET", z + "/operations/(?P<n>[^/]+)", lambda m: self._op(*m.groups())),
            ("POST", z + "/operations/(?P<n>[^/]+)/wait", lambda m: self.wait_op(*m.groups())),
            ("GET", z + "/operations", lambda m: self.list_ops(m["p"], m["z"], query)),
            (
                "GET",
                p + "/global/operations/(?P<n>[^/]+)",
                lambda m: self._op(m[1], "global", m[2]),
            ),
            (
                "POST",
                p + "/global/operations/(?P<n>[^/]+)/wait",
                lambda m: self.wait_op(m[1], "global", m[2]),
            ),
            ("POST", p + "/global/firewalls", lambda m: self.insert_firewall(m["p"], doc, rid)),
            ("GET", p + "/global/firewalls/(?P<n>[^/]+)", lambda m: self._firewall(*m.groups())),
            ("GET", p + "/global/firewalls", lambda m: self._firewalls(m["p"], query)),
            (
                "DELETE",
                p + "/global/firewalls/(?P<n>[^/]+)",
                lambda m: self._delete_firewall(*m.groups()),
            ),
        ]
        for verb, pattern, action in routes:
            match = re.fullmatch(pattern, path)
            if verb == method and match:
                if method == "POST" and "wait" in pattern:
                    return action(match)  # type: ignore[no-any-return]
                with self.lock:
                    self._tick()
                    return json.loads(json.dumps(action(match)))  # type: ignore[no-any-return]
        raise ApiError(404, "notFound", f"No route for {method} {path}")

    def _list(self, project: str, zone: str, query: dict[str, str]) -> Json:
        terms = parse_filter(query.get("filter", ""))
        items = [v for k, v in sorted(self.instances.items()) if k[:2] == (project, zone)]
        return {"kind": "compute#instanceList", "items": [i for i in items if matches(i, terms)]}

    def _firewalls(self, project: str, query: dict[str, str]) -> Json:
        terms = parse_filter(query.get("filter", ""))
        items = [v for k, v in sorted(self.firewalls.items()) if k[0] == project]
        return {"kind": "compute#firewallList", "items": [i for i in items if matches(i, terms)]}

    def _delete_firewall(self, project: str, name: str) -> Json:
        fw = self._firewall(project, name)
        return self._start(
            project, "global", "delete", fw, lambda _: self.firewalls.pop((project, name), 0)
        )

    def respond(
        self, method: str, path: str, query: dict[str, str], raw: bytes
    ) -> tuple[int, bytes, str]:
        try:
            status, out = 200, self.handle(method, path, query, json.loads(raw) if raw else None)
        except ApiError as exc:
            status, out = exc.code, exc.body()
        return status, json.dumps(out).encode(), "application/json; charset=UTF-8"

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on 127.0.0.1 (a free port) in a thread; yields the endpoint URL."""
        with serve_http(self.respond) as url:
            yield url


def _invalid(message: str) -> ApiError:
    return ApiError(400, "invalid", message)


def _check_labels(labels: Json) -> None:
    for key, value in labels.items():
        if not LABEL_KEY_RE.fullmatch(key) or not LABEL_VALUE_RE.fullmatch(str(value)):
            raise _invalid(f"Invalid value for field 'resource.labels': '{key}={value}'.")


def _check_instance(body: Json) -> None:
    name = str(body.get("name", ""))
    if not NAME_RE.fullmatch(name):
        raise _invalid(
            f"Invalid value for field 'resource.name': '{name}'. Must be a match "
            "of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
        )
    if not body.get("machineType"):
        raise _invalid("Invalid value for field 'resource.machineType': ''.")
    if not any(d.get("boot") for d in body.get("disks", [])):
        raise _invalid("Invalid value for field 'resource.disks': no boot disk.")
    if not body.get("networkInterfaces"):
        raise _invalid("Invalid value for field 'resource.networkInterfaces': none.")
    _check_labels(body.get("labels", {}))
    for tag in lookup(body, "tags.items") or []:
        if not NAME_RE.fullmatch(tag):
            raise _invalid(f"Invalid value for field 'resource.tags.items[0]': '{tag}'.")
    sched = body.get("scheduling", {})
    spot = sched.get("provisioningModel") == "SPOT"
    if spot and (
        sched.get("automaticRestart", True) or sched.get("onHostMaintenance") != "TERMINATE"
    ):
        raise _invalid(
            "Invalid value for field 'resource.scheduling': Spot VMs need "
            "automaticRestart=false and onHostMaintenance=TERMINATE."
        )
    limit = sched.get("maxRunDuration")
    if limit is not None:
        seconds = int(limit.get("seconds", 0))
        if not 30 <= seconds <= 120 * 86400:
            raise _invalid(
                "Invalid value for field 'resource.scheduling.maxRunDuration.seconds': "
                f"'{seconds}'. Must be between 30 and 10368000."
            )
        if sched.get("instanceTerminationAction") not in ("STOP", "DELETE"):
            raise _invalid(
                "Invalid value for field 'resource.scheduling.instanceTerminationAction': a VM "
                "with a time limit needs STOP or DELETE."
            )
    if sched.get("instanceTerminationAction") and not (spot or limit is not None):
        raise _invalid(
            "Invalid value for field 'resource.scheduling.instanceTerminationAction':"
            " only Spot VMs and VMs with a time limit take a termination action."
        )
    if body.get("guestAccelerators") and sched.get("onHostMaintenance") != "TERMINATE":
        raise _invalid("Instances with guest accelerators do not support live migration.")


def _instance_resource(body: Json, link: str, ident: str, ip: int) -> Json:
    inst = json.loads(json.dumps(body))
    inst.update(
        kind="compute#instance",
        id=ident,
        creationTimestamp=_now(),
        status="PROVISIONING",
        selfLink=link,
        cpuPlatform="Intel Broadwell",
        labelFingerprint="42WmSpB8rSM=",
        startRestricted=False,
        deletionProtection=False,
    )
    zone_url = link.rsplit("/instances/", 1)[0]
    inst["machineType"] = f"{zone_url}/machineTypes/{str(inst['machineType']).rsplit('/', 1)[-1]}"
    for i, nic in enumerate(inst.get("networkInterfaces", [])):
        nic.update(kind="compute#networkInterface", name=f"nic{i}", networkIP=f"10.128.0.{ip}")
        for ac in nic.get("accessConfigs", []):
            ac.update(kind="compute#accessConfig", natIP=f"203.0.113.{ip}")
    inst.setdefault("metadata", {}).update(kind="compute#metadata", fingerprint="ywBtY0cx0Ao=")
    inst.setdefault("tags", {})["fingerprint"] = "42WmSpB8rSM="
    return inst  # type: ignore[no-any-return]


def _firewall_resource(project: str, body: Json) -> Json:
    name = str(body.get("name", ""))
    if not NAME_RE.fullmatch(name):
        raise _invalid(f"Invalid value for field 'resource.name': '{name}'.")
    if not body.get("allowed") and not body.get("denied"):
        raise _invalid("Invalid value for field 'resource.allowed': none.")
    for rule in body.get("allowed", []):
        if rule.get("IPProtocol") not in ("tcp", "udp", "icmp", "all"):
            raise _invalid(f"Invalid value for field 'resource.allowed[0].IPProtocol': {rule}.")
        for port in rule.get("ports", []):
            if not re.fullmatch(r"\d{1,5}(-\d{1,5})?", port):
                raise _invalid(f"Invalid value for field 'resource.allowed[0].ports': '{port}'.")
    for cidr in body.get("sourceRanges", []):
        try:
            ipaddress.ip_network(cidr)
        except ValueError:
            raise _invalid(f"Invalid value for field 'resource.sourceRanges': '{cidr}'.") from None
    fw = json.loads(json.dumps(body))
    fw.setdefault("direction", "INGRESS")
    fw.setdefault("priority", 1000)
    if fw["direction"] == "INGRESS" and not fw.get("sourceRanges") and not fw.get("sourceTags"):
        fw["sourceRanges"] = ["0.0.0.0/0"]  # what the API does when no source is given
    network = str(fw.get("network") or "global/networks/default")
    if not network.startswith(("https://", "projects/")):
        network = f"projects/{project}/{network}"
    if not network.startswith("https://"):
        network = f"{API}/{network}"
    fw.update(
        kind="compute#firewall",
        network=network,
        selfLink=f"{API}/projects/{project}/global/firewalls/{name}",
        disabled=False,
        logConfig={"enable": False},
    )
    return fw  # type: ignore[no-any-return]

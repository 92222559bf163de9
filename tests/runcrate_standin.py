"""A local stand-in for Runcrate's API: the endpoints Runcrate's SDK calls for `run --rent` and
`prices` (instance types, SSH keys, create, status, get, list, delete), served on 127.0.0.1 by
the standard library's HTTP server in a thread, and passed to the SDK as its base URL
(RUNCRATE_BASE_URL). Its instances are the local OpenSSH server of tests/sshd.py: a ready
instance's address is 127.0.0.1 at that server's port.

Some GPU types misbehave on purpose: NEVER stays "provisioning"; POOR is refused at create (402,
with a message that echoes the API key, as a careless server might); BROKEN is created but its
status call fails (403, echoing the key); STICKY never gets ready and refuses to be deleted. Every request is kept (`requests`) and every instance
(`instances`), deleted or not.
"""

from __future__ import annotations

import getpass
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

TYPES = [("L40S", 1, 0.86), ("RTX 5090", 1, 0.89), ("H100 PCIe", 1, 2.39), ("H100 PCIe", 2, 4.6),
         ("RTX A6000", 1, 0.49), ("NEVER", 1, 0.1), ("POOR", 1, 0.1), ("BROKEN", 1, 0.1),
         ("STICKY", 1, 0.1)]


class StandIn:
    def __init__(self, ssh_port: int):
        self.ssh_port = ssh_port
        self.requests: list[dict] = []
        self.instances: dict[str, dict] = {}
        self.keys: list[dict] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def live(self) -> list[dict]:
        """Instances not deleted."""
        with self.lock:
            return [i for i in self.instances.values() if i["status"] != "terminated"]

    # -- the API ------------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict, body: dict | None, auth: str):
        key = auth.removeprefix("Bearer ")
        if not key.startswith("rc_live_"):
            return 401, {"error": {"code": "unauthorized", "message": "Invalid API key"}}
        parts = path.strip("/").split("/")[2:]          # after api/v1
        if parts == ["instances", "types"]:
            return 200, {"data": [{"id": f"type-{i}", "gpu_type": g, "gpu_count": n,
                                   "cpu_cores": 8 * n, "memory_gb": 64.0 * n,
                                   "storage_gb": 200.0, "region": "us-east",
                                   "hourly_rate": price} for i, (g, n, price) in enumerate(TYPES)]}
        if parts == ["ssh-keys"] and method == "GET":
            return 200, {"data": self.keys}
        if parts == ["ssh-keys"] and method == "POST":
            made = {"id": f"key_{len(self.keys) + 1}", "name": body["name"], "type": "ed25519"}
            self.keys.append(made)
            return 201, {"data": made}
        if parts == ["instances"] and method == "POST":
            return self._create(body, key)
        if parts == ["instances"] and method == "GET":
            search = query.get("search", [""])[0]
            return 200, {"data": [self._public(i) for i in self.instances.values()
                                  if search in i["name"]]}
        if len(parts) >= 2 and parts[0] == "instances" and parts[1] in self.instances:
            instance = self.instances[parts[1]]
            if method == "DELETE":
                if instance["gpu_type"] == "STICKY":
                    return 400, {"error": {"code": "locked", "message": "instance is locked"}}
                instance["status"] = "terminated"
                return 204, None
            if parts[2:] == ["status"]:
                return self._status(instance, key)
            if not parts[2:] and method == "GET":
                return 200, {"data": self._public(instance)}
        return 404, {"error": {"code": "not_found", "message": f"no route {method} {path}"}}

    def _create(self, body: dict, key: str):
        gpu = body["gpu_type"]
        if gpu == "POOR":
            return 402, {"error": {"code": "insufficient_credits",
                                   "message": f"Not enough credits for API key {key}"}}
        price = next(p for g, n, p in TYPES if g == gpu and n == body.get("gpu_count", 1))
        instance = {"id": f"inst_{uuid.uuid4().hex[:8]}", "name": body["name"], "gpu_type": gpu,
                    "gpu_count": body.get("gpu_count", 1), "status": "provisioning",
                    "cost_per_hour": price, "region": "us-east", "ip": None,
                    "max_runtime_minutes": body.get("max_runtime_minutes"), "polls": 0,
                    "ssh_key_id": body["ssh_key_id"]}
        self.instances[instance["id"]] = instance
        return 201, {"data": self._public(instance)}

    def _status(self, instance: dict, key: str):
        if instance["gpu_type"] == "BROKEN":
            return 403, {"error": {"code": "forbidden", "message": f"key {key} may not read it"}}
        instance["polls"] += 1
        if instance["gpu_type"] not in ("NEVER", "STICKY") and instance["polls"] >= 2 and \
                instance["status"] == "provisioning":
            instance.update(status="running", ip="127.0.0.1")
        return 200, {"data": {"id": instance["id"], "status": instance["status"],
                              "ip": instance["ip"]}}

    def _public(self, instance: dict) -> dict:
        shown = {k: v for k, v in instance.items() if k not in ("polls", "ssh_key_id")}
        if instance["ip"]:
            shown.update(ssh_port=self.ssh_port, ssh_user=getpass.getuser())
        return shown

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                auth = self.headers.get("Authorization", "")
                with standin.lock:
                    standin.requests.append({"method": self.command, "path": url.path,
                                             "body": body, "auth": auth})
                    status, answer = standin.handle(self.command, url.path, parse_qs(url.query),
                                                    body, auth)
                data = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                if answer is not None:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = _serve

            def log_message(self, *args):
                pass

        return Handler

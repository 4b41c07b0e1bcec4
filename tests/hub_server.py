"""A small Hugging Face Hub stand-in served over real HTTP on 127.0.0.1, for tests.

It implements the endpoints ``huggingface_hub`` (2.x) calls for ``create_repo``,
``upload_file``/``upload_folder``/``create_commit`` (regular, base64 uploads),
``ModelCard.push_to_hub`` (``validate-yaml``), Transformers' ``push_to_hub``, and
the download side that ``from_pretrained``, ``hf_hub_download`` and
``snapshot_download`` use: repo info (``/api/models/<id>`` and ``.../revision/<rev>``),
file listings (``.../tree/<rev>[/<path>]``) and files (``HEAD``/``GET /<id>/resolve/<rev>/<file>``
with ``X-Repo-Commit`` and ``ETag``), answering a missing repo, revision or file
with the 404 error codes the client maps to ``RepositoryNotFoundError`` /
``RevisionNotFoundError`` / ``EntryNotFoundError``. Every repo's files live in
memory with a commit log, so a test can check exactly what arrived; ``add_folder``
serves a local ``save_pretrained`` folder under a repo id. Point a *fresh* process
at it with ``HF_ENDPOINT=<hub.url>`` (``huggingface_hub`` reads the endpoint when
it is imported). Requests it does not implement get a 501 and are recorded in
``hub.unhandled``.

    with LocalHub() as hub:
        hub.add_folder("org/name", "path/to/saved_model")
        subprocess.run([...], env={**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0"})
        assert "model.safetensors" in hub.files("tester/my-model")

Run it by hand with ``python tests/hub_server.py --port 8765``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

DEFAULT_USER = "tester"


class _Repo:
    def __init__(self, repo_id: str, repo_type: str, private: bool):
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.private = private
        self.files: dict[str, bytes] = {}
        self.commits: list[dict] = []
        self.head = hashlib.sha1(repo_id.encode()).hexdigest()


class LocalHub:
    """In-memory Hub served by a ``ThreadingHTTPServer`` on a free 127.0.0.1 port."""

    def __init__(self, port: int = 0, user: str = DEFAULT_USER):
        self.user = user
        self.repos: dict[str, _Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.unhandled: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        hub = self

        class Handler(_Handler):
            owner = hub

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ---- lifecycle ----
    def start(self) -> LocalHub:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- content ----
    def add_folder(self, repo_id: str, folder, private: bool = False) -> str:
        """Serve every file under ``folder`` (recursively) as repo ``repo_id`` in one commit; returns its sha."""
        files = {}
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                with open(path, "rb") as fh:
                    files[os.path.relpath(path, folder).replace(os.sep, "/")] = fh.read()
        with self.lock:
            repo = self.repos.setdefault(repo_id, _Repo(repo_id, "model", private))
            repo.files.update(files)
            repo.head = _commit_oid(repo_id, len(repo.commits), "add_folder")
            repo.commits.append({"oid": repo.head, "summary": "add_folder", "added": sorted(files), "deleted": []})
        return repo.head

    # ---- inspection ----
    def downloads(self, repo_id: str) -> list[str]:
        """Files of ``repo_id`` fetched with GET so far (in order)."""
        prefix = f"/{repo_id}/resolve/"
        return [p[len(prefix) :].split("/", 1)[1] for m, p in self.requests if m == "GET" and p.startswith(prefix)]

    def files(self, repo_id: str) -> dict[str, bytes]:
        return dict(self.repos[repo_id].files)

    def commits(self, repo_id: str) -> list[dict]:
        return list(self.repos[repo_id].commits)


def _commit_oid(repo_id: str, n: int, summary: str) -> str:
    return hashlib.sha1(f"{repo_id}:{n}:{summary}:{time.time_ns()}".encode()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    owner: LocalHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet
        pass

    # ---- helpers ----
    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, payload=None, headers: dict | None = None, body: bytes | None = None, head=False):
        if body is None:
            body = json.dumps(payload if payload is not None else {}).encode()
            content_type = "application/json"
        else:
            content_type = "application/octet-stream"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, head=False):
        self._send(status, {"error": message}, headers={"X-Error-Code": code, "X-Error-Message": message}, head=head)

    def _repo_from(self, parts: list[str]) -> tuple[str, list[str]]:
        """``[ns, name, *rest]`` -> ``("ns/name", rest)``."""
        return f"{parts[0]}/{parts[1]}", parts[2:]

    # ---- routing ----
    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method: str):
        hub = self.owner
        path = urlparse(self.path).path
        hub.requests.append((method, path))
        parts = [unquote(p) for p in path.strip("/").split("/")]
        try:
            if method == "POST" and path == "/api/repos/create":
                return self._create_repo()
            if method == "POST" and path == "/api/validate-yaml":
                self._body()
                return self._send(200, {"errors": [], "warnings": []})
            if method == "GET" and path == "/api/agent-harnesses":  # huggingface_hub's agent registry: none
                return self._send(200, {"standardEnvVars": [], "harnesses": {}})
            if method == "GET" and path.startswith("/api/whoami"):
                return self._send(200, {"type": "user", "name": hub.user, "orgs": [], "auth": {"type": "access_token"}})
            if parts[:1] == ["api"] and len(parts) >= 4 and parts[1] in ("models", "datasets", "spaces"):
                repo_id, rest = self._repo_from(parts[2:])
                return self._repo_api(method, repo_id, rest)
            if len(parts) >= 5 and parts[2] == "resolve":
                repo_id = f"{parts[0]}/{parts[1]}"
                return self._resolve(method, repo_id, parts[3], "/".join(parts[4:]))
        except Exception as err:  # surface server bugs to the client as 500s
            return self._error(500, "ServerError", f"{type(err).__name__}: {err}")
        hub.unhandled.append((method, path))
        self._body()
        return self._error(501, "NotImplemented", f"local hub: {method} {path} is not implemented")

    def _create_repo(self):
        hub = self.owner
        data = json.loads(self._body() or b"{}")
        name = data.get("name")
        if not name:
            return self._error(400, "BadRequest", "name is required")
        namespace = data.get("organization") or hub.user
        repo_id = f"{namespace}/{name}"
        with hub.lock:
            exists = repo_id in hub.repos
            if not exists:
                hub.repos[repo_id] = _Repo(repo_id, data.get("type") or "model", bool(data.get("private")))
        if exists:
            return self._send(409, {"error": "You already created this model repo", "url": f"{hub.url}/{repo_id}"})
        return self._send(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id, "id": repo_id})

    def _repo_api(self, method: str, repo_id: str, rest: list[str]):
        hub = self.owner
        repo = hub.repos.get(repo_id)
        if repo is None:
            self._body()
            return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
        action = rest[0] if rest else ""
        if method == "POST" and action == "preupload":
            data = json.loads(self._body() or b"{}")
            files = [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                for f in data.get("files", [])
            ]
            return self._send(200, {"files": files, "commitOid": repo.head})
        if method == "POST" and action == "commit":
            return self._commit(repo)
        if method == "GET" and action in ("", "revision"):
            if action == "revision" and len(rest) > 1 and rest[1] not in ("main", repo.head):
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rest[1]}")
            siblings = [{"rfilename": p, "size": len(b)} for p, b in sorted(repo.files.items())]
            return self._send(
                200,
                {
                    "id": repo_id,
                    "modelId": repo_id,
                    "sha": repo.head,
                    "private": repo.private,
                    "siblings": siblings,
                    "tags": [],
                    "downloads": 0,
                    "likes": 0,
                    "lastModified": "2024-01-01T00:00:00.000Z",
                    "createdAt": "2024-01-01T00:00:00.000Z",
                },
            )
        if method == "GET" and action == "tree":
            return self._tree(repo, rest[1] if len(rest) > 1 else "main", "/".join(rest[2:]))
        hub.unhandled.append((method, "/".join(["api", repo_id, *rest])))
        self._body()
        return self._error(501, "NotImplemented", f"local hub: {method} {action} is not implemented")

    def _commit(self, repo: _Repo):
        hub = self.owner
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        header = next((x["value"] for x in lines if x.get("key") == "header"), {})
        added, deleted = [], []
        with hub.lock:
            for item in lines:
                key, value = item.get("key"), item.get("value", {})
                if key == "file":
                    if value.get("encoding") != "base64":
                        return self._error(400, "BadRequest", f"unsupported encoding {value.get('encoding')!r}")
                    repo.files[value["path"]] = base64.b64decode(value["content"])
                    added.append(value["path"])
                elif key == "deletedFile":
                    repo.files.pop(value["path"], None)
                    deleted.append(value["path"])
                elif key == "deletedFolder":
                    prefix = value["path"].rstrip("/") + "/"
                    for p in [p for p in repo.files if p.startswith(prefix)]:
                        repo.files.pop(p)
                        deleted.append(p)
                elif key in ("lfsFile", "copyFile"):
                    return self._error(400, "BadRequest", f"local hub: {key} operations are not supported")
            oid = _commit_oid(repo.repo_id, len(repo.commits), header.get("summary", ""))
            repo.head = oid
            repo.commits.append({"oid": oid, "summary": header.get("summary"), "added": added, "deleted": deleted})
        return self._send(
            200, {"commitUrl": f"{hub.url}/{repo.repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}
        )

    def _tree(self, repo: _Repo, revision: str, folder: str):
        """Every file under ``folder`` (recursive listing), or 404 when the folder does not exist."""
        if revision not in ("main", repo.head):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        prefix = folder.strip("/") + "/" if folder.strip("/") else ""
        entries = [
            {"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
            for p, b in sorted(repo.files.items())
            if p.startswith(prefix)
        ]
        if prefix and not entries:
            return self._error(404, "EntryNotFound", f"{folder} does not exist on {revision}")
        return self._send(200, entries)

    def _resolve(self, method: str, repo_id: str, revision: str, filename: str):
        hub = self.owner
        repo = hub.repos.get(repo_id)
        head = method == "HEAD"
        if repo is None:
            return self._error(404, "RepoNotFound", f"Repository {repo_id} not found", head=head)
        if revision not in ("main", repo.head):
            return self._error(404, "RevisionNotFound", f"Revision {revision} not found", head=head)
        data = repo.files.get(filename)
        if data is None:
            return self._error(404, "EntryNotFound", f"{filename} does not exist in {repo_id}", head=head)
        etag = hashlib.sha1(data).hexdigest()
        return self._send(200, body=data, headers={"X-Repo-Commit": repo.head, "ETag": f'"{etag}"'}, head=head)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Serve an in-memory Hub stand-in on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=8765)
    cli = parser.parse_args()
    hub = LocalHub(port=cli.port)
    print(f"local hub at {hub.url}")
    hub.server.serve_forever()

"""Who may call each route (server/routes.py, docs/security.md): the app built in-process over a stand-in
model (no engine: the guard answers before any handler), every route of it enumerated."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from vsurge.server import vSurgeApiServer
from vsurge.server.routes import ADMIN, GUARDED, LEVELS, METRICS, PUBLIC
from vsurge.server.web import STATIC_DIR

KEY, ADMIN_KEY = "sk-plain", "sk-admin"
PUBLIC_PATHS = {"/liveness", "/readiness", "/health", "/", "/dashboard", "/static"}
ADMIN_PATHS = {"/models/load", "/models/unload", "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
               "/v1/cache/save", "/v1/cache/restore", "/v1/cache/erase"}
FASTAPI_OWN = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}  # no level declared: GUARDED


def stand_in_model():
    """What the server reads of a model outside a request: its metrics' name, readiness, adapters."""
    from prometheus_client import CollectorRegistry

    return SimpleNamespace(metrics=SimpleNamespace(rename=lambda name: None, registry=CollectorRegistry()),
                           ready=False, adapter_names=[],
                           max_length=128, serves_adapters=False, adapter=lambda name: None)


def client_of(**settings) -> TestClient:
    server = vSurgeApiServer({"m": stand_in_model()}, **settings)
    return TestClient(server.app, raise_server_exceptions=False)


def requests_of(app):
    """(method, concrete path, route path, level) of every route: each method, path parameters filled in,
    a mount by one of its files."""
    static_file = next(p.name for p in STATIC_DIR.iterdir() if p.is_file())
    for route in app.routes:
        level = getattr(route, "access", GUARDED)
        if not hasattr(route, "methods"):  # the static files' mount
            yield "GET", f"{route.path}/{static_file}", route.path, level
            continue
        path = re.sub(r"\{(\w+)(:\w+)?\}", r"x", route.path)
        for method in sorted(route.methods - {"HEAD"}):
            yield method, path, route.path, level


def refused(response, path: str, status: int = 401) -> bool:
    body = response.json()
    if path.startswith("/v1/messages"):  # Anthropic's error JSON
        return response.status_code == status and body["type"] == "error" and \
            body["error"]["type"] == ("authentication_error" if status == 401 else "permission_error")
    return response.status_code == status and \
        body["error"]["type"] == ("authentication_error" if status == 401 else "permission_error")


@pytest.fixture(scope="module")
def keyed():
    return client_of(api_key=KEY)


def test_every_route_declares_a_level_and_the_public_and_admin_lists_are_these(keyed):
    levels = {}
    for _, _, path, level in requests_of(keyed.app):
        assert level in LEVELS, path
        levels[path] = level
    undeclared = {path for path in levels if not hasattr(next(r for r in keyed.app.routes if r.path == path), "access")}
    assert undeclared == FASTAPI_OWN  # every route of vsurge's own is declared through the table
    assert {p for p, level in levels.items() if level == PUBLIC} == PUBLIC_PATHS
    assert {p for p, level in levels.items() if level == ADMIN} == ADMIN_PATHS
    assert {p for p, level in levels.items() if level == METRICS} == {"/metrics"}
    assert "/v1/models/{model:path}" in levels and levels["/tokenize"] == GUARDED


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}],
                         ids=["no key", "wrong bearer", "wrong x-api-key"])
def test_every_route_but_the_public_ones_refuses_a_missing_or_wrong_key(keyed, headers):
    for method, path, _, level in requests_of(keyed.app):
        r = keyed.request(method, path, headers=headers, json={})
        if level in (PUBLIC, METRICS):
            assert r.status_code not in (401, 403), (method, path, r.status_code)
        else:
            assert refused(r, path), (method, path, r.status_code, r.text)
    assert refused(keyed.get("/no/such/route", headers=headers), "/no/such/route")  # unknown paths too


def test_the_key_opens_every_route(keyed):
    for method, path, _, _ in requests_of(keyed.app):
        for headers in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
            r = keyed.request(method, path, headers=headers, json={})
            assert r.status_code not in (401, 403), (method, path, r.status_code, r.text)


def test_the_admin_key_alone_guards_the_admin_routes():
    """--admin-api-key: admin routes take it (the plain key gets 403); every other guarded route takes either
    key. Without --api-key, only the admin routes need a key."""
    both = client_of(api_key=KEY, admin_api_key=ADMIN_KEY)
    admin_only = client_of(admin_api_key=ADMIN_KEY)
    for method, path, _, level in requests_of(both.app):
        plain = both.request(method, path, headers={"Authorization": f"Bearer {KEY}"}, json={})
        admin = both.request(method, path, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, json={})
        assert admin.status_code not in (401, 403), (method, path)
        nobody = admin_only.request(method, path, json={})
        if level == ADMIN:
            assert refused(plain, path, 403) and refused(nobody, path), (method, path)
        else:
            assert plain.status_code not in (401, 403) and nobody.status_code not in (401, 403), (method, path)


def test_metrics_is_public_unless_guarded():
    assert client_of(api_key=KEY).get("/metrics").status_code == 200
    guarded = client_of(api_key=KEY, guard_metrics=True)
    assert refused(guarded.get("/metrics"), "/metrics")
    assert guarded.get("/metrics", headers={"x-api-key": KEY}).status_code == 200


def test_get_one_model():
    client = client_of()
    r = client.get("/v1/models/m")
    assert r.status_code == 200 and r.json()["id"] == "m" and r.json()["object"] == "model"
    r = client.get("/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["param"] == "model"


# ---------------------------------------------------------------- runtime LoRA adapters
def test_runtime_adapter_loading_is_off_unless_asked_for():
    r = client_of().post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp"})
    assert r.status_code == 403 and "--allow-runtime-lora" in r.json()["error"]["message"]
    r = client_of().post("/v1/unload_lora_adapter", json={"lora_name": "x"})
    assert r.status_code == 403
    r = client_of(allow_runtime_lora=True).post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp"})
    assert r.status_code == 400 and "serves no LoRA adapters" in r.json()["error"]["message"]  # past the switch


def test_the_runtime_flags(tmp_path):
    from vsurge.cli.arguments import build_parser, runtime_lora_allowed

    def runtime(*flags):
        return runtime_lora_allowed(build_parser().parse_args(["serve", *flags]))

    assert not runtime("--lora", "a=/x") and not runtime("--max-loras", "2")
    assert runtime("--enable-lora") and runtime("--allow-runtime-lora") and runtime("--lora-dir", str(tmp_path))


def test_lora_dir_keeps_adapters_inside_it(tmp_path):
    root, outside = tmp_path / "adapters", tmp_path / "outside"
    (root / "inner").mkdir(parents=True)
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    client = client_of(lora_dir=str(root))
    for path in ("../outside", str(outside), "escape", "inner/../../outside", "/etc"):
        r = client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": path})
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path", (path, r.text)
        assert "outside the server's --lora-dir" in r.json()["error"]["message"] and repr(path) in r.text
    for path in ("inner", str(root / "inner"), "inner/../inner"):  # inside: on to the model (which has no slots)
        r = client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": path})
        assert r.status_code == 400 and "serves no LoRA adapters" in r.text, (path, r.text)


TOY_ADAPTER = '''
"""POST /v1/echo: a toy wire format, its route declared here and nowhere else."""
from __future__ import annotations

from pydantic import BaseModel

from vsurge.server.routes import GUARDED, Route


class EchoRequest(BaseModel):
    text: str
    times: int = 1


async def respond(server, body: EchoRequest):
    """Echo the text."""
    return {"echo": body.text * body.times, "models": sorted(server.surges)}


ROUTES = (Route("POST", "/v1/echo", GUARDED, respond, "echo"),)
'''


def test_a_new_endpoint_is_its_adapter_module(tmp_path, monkeypatch):
    """An adapter module that declares ROUTES is served with nothing else edited: its access level guards it,
    its body model validates (the API's 400 JSON), and its answer gets the server."""
    from vsurge.server import adapters

    (tmp_path / "toy_echo.py").write_text(TOY_ADAPTER)
    monkeypatch.setattr(adapters, "__path__", [*adapters.__path__, str(tmp_path)])
    client = client_of(api_key=KEY)
    assert refused(client.post("/v1/echo", json={"text": "a"}), "/v1/echo")
    auth = {"Authorization": f"Bearer {KEY}"}
    ok = client.post("/v1/echo", json={"text": "ab", "times": 2}, headers=auth)
    assert ok.status_code == 200 and ok.json() == {"echo": "abab", "models": ["m"]}
    bad = client.post("/v1/echo", json={"times": 2}, headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text"
    assert "echo" in {r.name for r in client.app.routes}  # its OpenAPI operation's name
    assert {r.path for r in client.app.routes} >= {"/v1/chat/completions", "/v1/responses/{response_id}",
                                                    "/v1/messages/count_tokens", "/v1/embeddings"}

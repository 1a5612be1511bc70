"""deploy/ray/ and docs/scaling.md: the Serve config and the KubeRay RayService manifests parse, name the app, import path and args
vsurge's Serve application has, their `vsurge serve` flags parse, and build_app builds the application from
them (no cluster: Serve applications bind offline). A TPU manifest reserves as many chips per replica as its
workers have and runs tensor parallel over them."""

from __future__ import annotations

import importlib
import shlex
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray.serve")

from vsurge.cli.arguments import build_parser  # noqa: E402
from vsurge.scale.ray_serve.app import APP_NAME, BUILD_ARGS, build_app  # noqa: E402

DEPLOY = Path(__file__).parents[2] / "deploy" / "ray"
MANIFESTS = sorted(DEPLOY.glob("rayservice-*.yaml"))


SCALING_DOC = Path(__file__).parents[2] / "docs" / "scaling.md"


def serve_config(path: Path) -> dict:
    if path == SCALING_DOC:  # the config shown in the docs
        import re

        return yaml.safe_load(re.search(r"```yaml\n# vsurge.yaml\n(.*?)```", path.read_text(), re.S).group(1))
    doc = yaml.safe_load(path.read_text())
    if doc.get("kind") == "RayService":
        assert doc["apiVersion"] == "ray.io/v1"
        return yaml.safe_load(doc["spec"]["serveConfigV2"])
    return doc


def check_app(app: dict) -> None:
    assert app["name"] == APP_NAME and app["route_prefix"] == "/"
    module, attr = app["import_path"].split(":")
    assert getattr(importlib.import_module(module), attr) is build_app
    assert set(app["args"]) <= set(BUILD_ARGS), set(app["args"]) - set(BUILD_ARGS)
    build_parser().parse_args(["serve", *shlex.split(app["args"]["serve_args"])])  # exits on a flag we lack
    from ray import serve

    assert isinstance(build_app(dict(app["args"])), serve.Application)


@pytest.mark.parametrize("path", [SCALING_DOC, DEPLOY / "serve.yaml", *MANIFESTS], ids=lambda p: p.name)
def test_each_file_names_the_app_and_flags_the_code_has(path):
    apps = serve_config(path)["applications"]
    assert len(apps) == 1
    check_app(apps[0])


def test_the_manifests_run_the_installed_ray_and_the_tpu_one_reserves_its_chips():
    import ray

    assert [p.name for p in MANIFESTS] == ["rayservice-cpu.yaml", "rayservice-tpu-v5e.yaml"]
    for path in MANIFESTS:
        spec = yaml.safe_load(path.read_text())["spec"]
        assert spec["rayClusterConfig"]["rayVersion"].split(".")[:2] == ray.__version__.split(".")[:2]
    spec = yaml.safe_load((DEPLOY / "rayservice-tpu-v5e.yaml").read_text())["spec"]
    args = yaml.safe_load(spec["serveConfigV2"])["applications"][0]["args"]
    (group,) = spec["rayClusterConfig"]["workerGroupSpecs"]
    pod = group["template"]["spec"]
    chips = int(pod["containers"][0]["resources"]["limits"]["google.com/tpu"])
    assert args["replica_tpus"] == chips and f'"TPU\\": {chips}' in group["rayStartParams"]["resources"]
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5-lite-podslice"
    parsed = build_parser().parse_args(["serve", *shlex.split(args["serve_args"])])
    assert parsed.tensor_parallel_size == chips


def test_unknown_args_and_flags_a_replica_cannot_take_are_refused():
    with pytest.raises(ValueError, match="takes args serve_args.*got replica_gpus"):
        build_app({"serve_args": "--model default", "replica_gpus": 1})
    with pytest.raises(SystemExit):
        build_app({"serve_args": "--no-such-flag 1"})
    with pytest.raises(ValueError, match="--uds cannot be used on Ray Serve"):
        build_app({"serve_args": "--model default --uds /tmp/x.sock"})
    with pytest.raises(ValueError, match="replica_hosts must be at least 1, got 0"):
        build_app({"serve_args": "--model default", "replica_hosts": 0})

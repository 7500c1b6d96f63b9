"""The Ray Serve application: ``serve run dapo.serve:build_app model=PATH tensor-parallel-size=N``.

One deployment, :class:`DapoOpenAIServer`, hosts :class:`dapo.serve.server.OpenAIServer` behind Ray Serve's HTTP proxy
(FastAPI ingress). Replicas: ``num-replicas`` when given, else GPUs in the cluster // tensor-parallel size (the
published layout), at least 1. A replica with tensor parallelism > 1 gets a STRICT_PACK placement group of one GPU per
rank, as the published server does; up to ``max-ongoing-requests`` (256) requests per replica are in flight, and a
replica batches them (:mod:`dapo.serve.batching`).
"""

from typing import Any

from fastapi import FastAPI, Request
from ray import serve

from dapo.serve.config import ServeConfig
from dapo.serve.ray_runtime import bind_replica_grpc_to_loopback
from dapo.serve.server import OpenAIServer, install_error_handlers

api = FastAPI(title="dapo serve")
install_error_handlers(api)


# The routes are module functions that find their replica through Ray's replica context, not methods of the
# deployment class. Ray Serve turns class methods into routes by rewriting their signatures (``self`` becomes a
# dependency) and relies on ``include_router`` to re-analyse them; FastAPI >= 0.137 keeps the analysis made when the
# route was declared, so every method route then asks for a query parameter (``self`` or ``request``) and answers 422.
# Plain functions are analysed once, as written, on every FastAPI version.
def _server() -> OpenAIServer:
    return serve.get_replica_context().servable_object.server


@api.get("/health")
async def health(request: Request):
    return await _server().health(request)


@api.get("/v1/models")
async def models(request: Request):
    return await _server().models(request)


@api.post("/v1/chat/completions")
async def chat(request: Request):
    return await _server().chat(request)


@api.post("/v1/completions")
async def completions(request: Request):
    return await _server().completions(request)


@serve.deployment(name="dapo-openai")
@serve.ingress(api)
class DapoOpenAIServer:
    def __init__(self, config: dict[str, Any]) -> None:
        cfg = ServeConfig(**config)
        if cfg.loopback_only:
            bind_replica_grpc_to_loopback()
        self.server = OpenAIServer(cfg)

    def check_health(self) -> None:  # Ray Serve's replica health check
        if self.server.batcher._task is not None and self.server.batcher._task.done():
            exc = self.server.batcher._task.exception()
            if exc is not None:
                raise RuntimeError(f"the batching loop died: {exc!r}")


def _cluster_gpus() -> int:
    import ray

    try:
        return int(ray.cluster_resources().get("GPU", 0)) if ray.is_initialized() else 0
    except Exception:
        return 0


def deployment_options(cfg: ServeConfig, gpus: int | None = None) -> dict[str, Any]:
    """Ray Serve options for ``cfg``: replicas, per-replica resources and placement."""
    gpus = _cluster_gpus() if gpus is None else gpus
    tp = cfg.tensor_parallel_size
    use_gpu = gpus > 0 and cfg.device != "cpu"
    replicas = cfg.num_replicas or (max(1, gpus // tp) if use_gpu else 1)
    options: dict[str, Any] = {"num_replicas": replicas, "max_ongoing_requests": cfg.max_ongoing_requests}
    if use_gpu and tp > 1:
        options["placement_group_bundles"] = [{"CPU": cfg.num_cpus, "GPU": 1}] + [{"GPU": 1}] * (tp - 1)
        options["placement_group_strategy"] = "STRICT_PACK"
        options["ray_actor_options"] = {"num_cpus": cfg.num_cpus, "num_gpus": 1}
    else:
        options["ray_actor_options"] = {"num_cpus": cfg.num_cpus, "num_gpus": 1 if use_gpu else 0}
    return options


def build_app(args: dict[str, Any] | None = None, **kwargs: Any):
    """The Ray Serve application for ``args`` (``serve run`` passes ``key=value`` pairs as strings)."""
    cfg = ServeConfig.from_args({**(args or {}), **kwargs})
    return DapoOpenAIServer.options(**deployment_options(cfg)).bind(cfg.to_dict())

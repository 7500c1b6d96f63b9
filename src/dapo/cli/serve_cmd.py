"""``dapo serve MODEL``: the model behind an OpenAI-compatible API on Ray Serve (loopback unless told otherwise).

    dapo serve                                    # the embedded tiny model on http://127.0.0.1:8000/v1
    dapo serve runs/x/checkpoints/global_step_30/hf --backend vllm --tensor-parallel-size 8

Clients reach dapo's front door (:mod:`dapo.serve.front`, in this process), which forwards whole requests to Ray
Serve's proxy on a loopback port. The same application is ``serve run dapo.serve:build_app model=PATH
tensor-parallel-size=N``, with Ray Serve's proxy facing clients and no front door. See docs/serving.md.
"""

from __future__ import annotations

import click

from dapo.infra.device import DEVICE_CHOICES
from dapo.serve.config import BACKENDS


@click.command("serve")
@click.argument("model", required=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (0.0.0.0 exposes the server)")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="auto",
    show_default=True,
    help="auto = vLLM on a GPU when installed, else the project's HF engine",
)
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--num-replicas",
    type=click.IntRange(min=1),
    default=None,
    help="default: GPUs // tensor-parallel size, or 1 without GPUs",
)
@click.option("--served-model-name", default=None, help="the name clients use (default: the model folder's name)")
@click.option("--device", type=click.Choice(DEVICE_CHOICES), default="auto", show_default=True)
@click.option("--max-model-len", type=click.IntRange(min=2), default=None, help="prompt + response tokens at most")
@click.option("--max-tokens-limit", type=click.IntRange(min=1), default=32768, show_default=True)
@click.option("--max-n", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--num-cpus", type=click.FloatRange(min=0), default=1.0, show_default=True, help="CPUs reserved per replica"
)
@click.option("--num-threads", type=click.IntRange(min=1), default=None, help="torch threads per replica")
@click.option(
    "--max-sequences-per-request",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="prompts x n of one request, at most",
)
@click.option(
    "--header-timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="seconds a client may take to send a request's headers (408 and closed after)",
)
@click.option(
    "--body-timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="seconds a request body may take to arrive after its headers (408 after)",
)
@click.option(
    "--max-unfinished-uploads",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="request bodies still arriving 1 s after their headers, at most; one more drops the oldest (503)",
)
@click.option(
    "--keep-alive-timeout",
    type=click.FloatRange(min=0.1),
    default=15.0,
    show_default=True,
    help="seconds an idle keep-alive connection stays open",
)
@click.option(
    "--shutdown-drain",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="on SIGINT/SIGTERM, seconds the requests in flight get to finish (new ones get 503)",
)
@click.option(
    "--ray-address", default=None, help="an existing Ray cluster (default: start a local one, bound to 127.0.0.1)"
)
def serve_command(
    model,
    host,
    port,
    backend,
    tensor_parallel_size,
    num_replicas,
    served_model_name,
    device,
    max_model_len,
    max_tokens_limit,
    max_n,
    num_cpus,
    num_threads,
    max_sequences_per_request,
    header_timeout,
    body_timeout,
    max_unfinished_uploads,
    keep_alive_timeout,
    shutdown_drain,
    ray_address,
) -> None:
    """Serve MODEL (default: the embedded tiny Qwen2) with /v1/chat/completions, /v1/completions, /v1/models.

    Clients talk to dapo's front door on --host/--port, which holds them to the header, body and upload bounds
    before forwarding whole requests to Ray Serve's proxy on a loopback port."""
    from dapo.serve import ServeConfig, ServeConfigError, ray_serve_available

    ok, reason = ray_serve_available()
    if not ok:
        raise click.ClickException(reason)
    try:
        cfg = ServeConfig(
            model=model,
            served_model_name=served_model_name,
            backend=backend,
            tensor_parallel_size=tensor_parallel_size,
            num_replicas=num_replicas,
            device=device,
            max_model_len=max_model_len,
            max_tokens_limit=max_tokens_limit,
            max_n=max_n,
            num_cpus=num_cpus,
            num_threads=num_threads,
            loopback_only=ray_address is None,
            max_sequences_per_request=max_sequences_per_request,
            header_timeout_s=header_timeout,
            body_timeout_s=body_timeout,
            max_unfinished_uploads=max_unfinished_uploads,
            keep_alive_timeout_s=keep_alive_timeout,
            shutdown_drain_s=shutdown_drain,
        )
    except ServeConfigError as e:
        raise click.ClickException(str(e)) from None
    # Everything that can be checked in a second is checked before Ray spends ~30 s starting.
    from dapo.config import ModelConfig
    from dapo.model.loading import ModelLoadError, resolve_model_path
    from dapo.serve.front import bind_socket
    from dapo.serve.ray_runtime import ServeStartError, start_ray

    try:
        resolve_model_path(ModelConfig(path=model))
    except ModelLoadError as e:
        raise click.ClickException(f"cannot serve the model: {e}") from None
    sock = None
    try:
        sock = bind_socket(host, port)  # held from now on: Ray's start-up (~30 s) cannot lose the port
        start_ray(ray_address)
    except ServeStartError as e:
        if sock is not None:
            sock.close()
        raise click.ClickException(str(e)) from None
    import ray

    try:
        _run(cfg, sock, host, port, local=ray_address is None)
    except KeyboardInterrupt:
        click.echo("dapo serve: stopping", err=True)
    finally:
        sock.close()
        ray.shutdown()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _run(cfg, sock, host: str, port: int, *, local: bool) -> None:
    import asyncio
    import signal

    from ray import serve

    from dapo.serve import build_app
    from dapo.serve.front import Front
    from dapo.serve.ray_runtime import free_loopback_port

    proxy_port = free_loopback_port()  # Ray Serve's proxy: loopback only, reached through the front door
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": proxy_port})
        serve.run(build_app(cfg.to_dict()), name="dapo", route_prefix="/")
    except KeyboardInterrupt:
        raise
    except Exception as e:  # a replica that cannot load the model, a proxy that cannot bind: Ray's traceback is long
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise click.ClickException(
            f"the server did not start: {first[:400]} (the replica's log is under /tmp/ray/session_latest/logs/serve/)"
        ) from None
    # Ray replaces the handlers while it starts; Ctrl-C and SIGTERM stop the server from here on (the front's event
    # loop takes them over while it runs).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    banner = (
        f"dapo serve: '{cfg.model_name}' at http://{host}:{port}/v1 (Ctrl-C stops); Ray Serve's proxy behind "
        f"it: 127.0.0.1:{proxy_port}"
    )
    try:
        asyncio.run(_serve_front(Front(cfg, f"http://127.0.0.1:{proxy_port}"), sock, banner))
    finally:
        if not local:  # on a cluster the application must be removed; a local Ray goes down with ray.shutdown()
            serve.delete("dapo")


async def _serve_front(front, sock, banner: str) -> None:
    """The front door on ``sock`` until SIGINT or SIGTERM; it listens only once Ray's proxy answers."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await front.wait_upstream(60)
    except RuntimeError as e:
        raise click.ClickException(f"the server did not start: {e}") from None
    await front.start(sock)
    click.echo(banner, err=True)
    try:
        await stop.wait()
        click.echo(
            f"dapo serve: stopping: requests in flight get up to {front.cfg.shutdown_drain_s:g} s to finish "
            "(shutdown_drain_s); new ones are refused",
            err=True,
        )
    finally:
        await front.close(front.cfg.shutdown_drain_s)
    click.echo("dapo serve: stopped", err=True)

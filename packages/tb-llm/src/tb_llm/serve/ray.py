"""Scale-out on Ray Serve: the OpenAI-compatible server as a Ray Serve application of N replicas.

    from ray import serve
    from tb_llm.serve.ray import build_app

    serve.run(build_app(model="path/or/hub-id", num_replicas=2, quant="int8", max_batch=8))
    # clients use http://<head>:8000/v1 as they would the plain server

or from the command line (Ray's own CLI, arguments as ``key=value``)::

    serve run tb_llm.serve.ray:app_builder model=path/to/model num_replicas=2 quant=int8

Each replica is one process that loads the model and runs the plain server's app (continuous
batching, streaming, logprobs, structured output, prefix cache, ``/metrics``) behind Ray Serve's
HTTP proxy, which spreads requests over the replicas. Ray restarts a replica that dies; requests
that were running on it end with an error response (or a cut stream), the others go on. Needs the
``ray`` extra (``pip install 'tb-llm[ray]'``).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from tb_llm.serve.settings import ServeSettings

__all__ = ["DEPLOYMENT_NAME", "app_builder", "build_app"]

#: The Ray Serve deployment's name (its replicas' actor names contain it).
DEPLOYMENT_NAME = "tb-llm"


def build_app(
    model: str,
    num_replicas: int = 1,
    *,
    quant: str = "fp32",
    device: str = "cpu",
    engine: str | None = None,
    threads: int | None = None,
    num_cpus: float | None = None,
    max_ongoing_requests: int | None = None,
    **settings: Any,
) -> Any:
    """A Ray Serve application serving ``model`` (a folder, a ``.gguf`` file or a Hub id) from
    ``num_replicas`` replicas. ``threads``: torch threads per replica (default: as torch picks);
    ``num_cpus``: CPUs Ray reserves per replica (default: ``threads`` or 1);
    ``max_ongoing_requests``: requests Ray sends one replica at once (default: ``max_batch`` +
    ``max_queue``, so the replica's own queue limit answers 429 first). ``settings``: the fields
    of :class:`~tb_llm.serve.settings.ServeSettings` (``model_name`` defaults to ``model``)."""
    from ray import serve

    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas must be an integer >= 1, got {num_replicas!r}")
    known = {f.name for f in fields(ServeSettings)}
    unknown = set(settings) - known
    if unknown:
        raise ValueError(f"unknown server setting(s): {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
    serve_settings = ServeSettings(**{"model_name": str(model), **settings})  # checked here, in the driver
    ongoing = max_ongoing_requests or serve_settings.max_batch + serve_settings.max_queue

    def build_asgi() -> Any:
        """Runs on each replica: load the model, build the plain server's app."""
        import torch

        from tb_llm import LLM
        from tb_llm.serve.app import create_app

        if threads:
            torch.set_num_threads(threads)
        llm = LLM.from_pretrained(model, quant=quant, device=device, engine=engine)
        return create_app(llm, serve_settings)

    @serve.deployment(
        name=DEPLOYMENT_NAME,
        num_replicas=num_replicas,
        max_ongoing_requests=ongoing,
        ray_actor_options={"num_cpus": num_cpus if num_cpus is not None else float(threads or 1)},
        health_check_period_s=2.0,
        health_check_timeout_s=30.0,
    )
    @serve.ingress(build_asgi)
    class TbLLMReplica:
        """One replica: the ASGI app built by ``build_asgi`` answers its HTTP requests."""

    return TbLLMReplica.bind()  # type: ignore[attr-defined]  # serve.deployment made it a Deployment


_INT_ARGS = ("num_replicas", "threads", "max_ongoing_requests", "max_batch", "max_queue", "max_model_len")
_FLOAT_ARGS = ("num_cpus", "prefix_cache_mb", "drain_timeout")


def app_builder(args: dict[str, str]) -> Any:
    """``serve run tb_llm.serve.ray:app_builder model=... num_replicas=2 ...``: Ray's CLI passes
    ``key=value`` strings; numbers are converted here."""
    kwargs: dict[str, Any] = dict(args)
    if "model" not in kwargs:
        raise ValueError("app_builder needs model=<folder, .gguf file or Hub id>")
    for key in _INT_ARGS:
        if key in kwargs:
            kwargs[key] = int(kwargs[key])
    for key in _FLOAT_ARGS:
        if key in kwargs:
            kwargs[key] = float(kwargs[key])
    model = kwargs.pop("model")
    return build_app(model, **kwargs)

"""``python -m tb_llm serve`` / ``torchburn llm serve``: arguments (cheap to import) and run."""

from __future__ import annotations

import argparse
import sys


def add_serve_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    help_text = "OpenAI-compatible HTTP server (chat/completions, streaming, continuous batching)"
    p: argparse.ArgumentParser = sub.add_parser("serve", help=help_text, description=help_text)
    p.add_argument("--model", "-m", required=True, help="local folder or Hugging Face repo id")
    p.add_argument("--quant", "-q", default="fp32", choices=["fp32", "bf16", "int8", "int4"])
    p.add_argument("--group-size", type=int, default=32, choices=[32, 64, 128], help="int4 group size")
    p.add_argument("--device", "-d", default="auto", choices=["auto", "cpu", "gpu"])
    p.add_argument("--engine", default=None, help="TorchBurn engine whose LLM backend to use")
    p.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' (default: $TORCHBURN_API_KEY; none)"
    )
    p.add_argument("--served-model-name", default=None, help="model id clients send (default: the folder name)")
    p.add_argument("--max-batch", type=int, default=16, help="sequences decoded together in one step")
    p.add_argument("--max-queue", type=int, default=256, help="requests that may wait for a batch row (then 429)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (then 413)")
    p.add_argument("--max-model-len", type=int, default=None, help="prompt + completion tokens per request")
    p.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=512.0,
        help="memory for reusing the KV of shared prompt prefixes (system prompts, chat turns); 0 turns it off",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM: seconds running requests may take to finish before they are ended",
    )
    p.add_argument(
        "--speculative",
        default="none",
        choices=["none", "ngram"],
        help="speculative decoding for requests that do not set 'speculative' themselves: 'ngram' (prompt "
        "lookup; runs while a request is alone in the batch; greedy output unchanged)",
    )
    p.add_argument("--draft-tokens", type=int, default=4, help="tokens drafted per speculative step (1..32)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(llm_command="serve")
    return p


def run_serve(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print("error: the server needs its extra: pip install 'tb-llm[serve]'", file=sys.stderr)
        return 2
    import torch

    from tb_llm import LLM, LLMError
    from tb_llm.serve.http_server import serve
    from tb_llm.serve.settings import ServeSettings

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.max_batch < 1:
        print("error: --max-batch must be >= 1", file=sys.stderr)
        return 2
    if args.prefix_cache_mb < 0:
        print("error: --prefix-cache-mb must be >= 0 (0 turns the prefix cache off)", file=sys.stderr)
        return 2
    if args.drain_timeout < 0:
        print("error: --drain-timeout must be >= 0", file=sys.stderr)
        return 2
    if not 1 <= args.draft_tokens <= 32:
        print("error: --draft-tokens must be in 1..32", file=sys.stderr)
        return 2
    try:
        llm = LLM.from_pretrained(
            args.model,
            quant=args.quant,
            device=args.device,
            engine=args.engine,
            revision=args.revision,
            group_size=args.group_size,
        )
    except (LLMError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    name = args.served_model_name or llm.path.name
    aliases = tuple(a for a in {str(args.model), str(llm.path)} if a != name)
    settings = ServeSettings(
        model_name=name,
        aliases=aliases,
        api_key=ServeSettings.api_key_from_env(args.api_key),
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes,
        max_model_len=args.max_model_len,
        prefix_cache_mb=args.prefix_cache_mb,
        drain_timeout=args.drain_timeout,
        speculative=None if args.speculative == "none" else args.speculative,
        draft_tokens=args.draft_tokens,
    )
    print(
        f"serving {name!r} ({llm!r}) on http://{args.host}:{args.port}/v1"
        f" (max batch {settings.max_batch}, API key {'required' if settings.api_key else 'not required'})",
        file=sys.stderr,
    )
    serve(llm, settings, args.host, args.port, args.log_level)
    return 0

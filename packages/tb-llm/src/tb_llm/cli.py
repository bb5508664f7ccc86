"""``python -m tb_llm chat|generate|benchmark|perplexity|serve`` (also ``torchburn llm ...``).

Nothing heavy is imported until a command runs: ``--help`` answers without loading torch."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tb_llm.serve.cli import add_serve_parser, run_serve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="llm_command")  # the usage line lists every command
    sub.required = True
    for name, help_text in (
        ("chat", "interactive multi-turn chat (the KV cache is kept across turns)"),
        ("generate", "complete one prompt"),
        ("benchmark", "prefill and decode speed, memory and engine"),
        ("perplexity", "perplexity of a text file, cut into windows as llama.cpp's llama-perplexity does"),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--model", "-m", required=True, help="local folder or Hugging Face repo id")
        p.add_argument("--quant", "-q", default="fp32", choices=["fp32", "bf16", "int8", "int4"])
        p.add_argument("--group-size", type=int, default=32, choices=[32, 64, 128], help="int4 group size")
        p.add_argument("--device", "-d", default="auto", choices=["auto", "cpu", "gpu"])
        p.add_argument(
            "--engine", default=None, help="TorchBurn engine whose LLM backend to use (default: best installed)"
        )
        p.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit)")
        p.add_argument("--tokens", "-n", type=int, default=None, help="new tokens to generate")
        p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
        if name == "benchmark":
            p.add_argument("--prompt-tokens", type=int, default=128, help="prefill length")
            p.add_argument("--repeat", type=int, default=3, help="runs; the median is reported")
            continue
        if name == "perplexity":
            p.add_argument("--file", "-f", required=True, help="the text to score (UTF-8)")
            p.add_argument("--ctx", "-c", type=int, default=512, help="context size: tokens per chunk / window")
            p.add_argument(
                "--stride", type=int, default=None, help="windows every STRIDE tokens, each scoring its last STRIDE"
            )
            continue
        p.add_argument("--temperature", "-t", type=float, default=0.0 if name == "generate" else 0.7)
        p.add_argument("--top-k", type=int, default=0)
        p.add_argument("--top-p", type=float, default=1.0)
        p.add_argument("--min-p", type=float, default=0.0)
        p.add_argument("--repetition-penalty", type=float, default=1.0)
        p.add_argument("--seed", type=int, default=None)
        p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
        if name == "generate":
            p.add_argument("prompt", nargs="?", default=None, help="the prompt (default: read stdin)")
            p.add_argument("--stream", action="store_true", help="print tokens as they come")
            p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
            p.add_argument(
                "--speculative",
                default=None,
                metavar="ngram|MODEL",
                help="speculative decoding: 'ngram' (prompt lookup) or a draft model (folder, Hub id or .gguf "
                "with the same tokenizer)",
            )
            p.add_argument("--draft-tokens", type=int, default=4, help="tokens drafted per step (speculative)")
        else:
            p.add_argument("--system", default=None, help="system prompt")
            p.add_argument("--stream", action="store_true", help="(chat always streams)")
    add_serve_parser(sub)


def run(args: argparse.Namespace) -> int:
    if args.llm_command == "serve":
        return run_serve(args)
    import torch

    from tb_llm import LLM, LLMError

    if args.threads:
        torch.set_num_threads(args.threads)
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
    if args.llm_command == "perplexity":
        return _perplexity(llm, args)
    if args.llm_command == "benchmark":
        from tb_llm.bench import benchmark

        r = benchmark(llm, prompt_tokens=args.prompt_tokens, new_tokens=args.tokens or 32, repeat=args.repeat)
        print(f"model      {llm.path}")
        print(f"engine     {r['engine']} on {r['device']}, quant {r['quant']}, {torch.get_num_threads()} threads")
        print(f"load       {r['load_s']:.2f} s (to first token {r['first_token_s']:.2f} s)")
        print(f"prefill    {r['prefill_tok_s']:.1f} tok/s ({r['prompt_tokens']} tokens)")
        print(f"decode     {r['decode_tok_s']:.1f} tok/s, {r['ms_per_token']:.2f} ms/token ({r['new_tokens']} tokens)")
        print(
            f"memory     weights {r['weight_mb']:.1f} MB, KV cache {r['kv_mb']:.1f} MB, peak RSS {r['peak_rss_mb']:.0f} MB"
        )
        return 0
    sampling = dict(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=args.stop,
    )
    if args.llm_command == "chat":
        llm.chat(system_prompt=args.system, max_new_tokens=args.tokens or 512, **sampling)
        return 0
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    message = [{"role": "user", "content": prompt}] if args.chat else prompt
    n = args.tokens or 128
    if args.speculative is not None:
        try:
            draft = None
            if args.speculative not in ("ngram", "prompt_lookup"):
                draft = LLM.from_pretrained(args.speculative, quant=args.quant, device=args.device, engine=args.engine)
            sampling["speculative"] = {
                "method": "draft" if draft is not None else "ngram",
                "num_tokens": args.draft_tokens,
                **({"draft": draft} if draft is not None else {}),
            }
            from tb_llm.speculative import parse_speculative

            parse_speculative(sampling["speculative"])
        except (LLMError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.stream:
        out: list = []
        for delta in llm.stream(message, max_new_tokens=n, result=out, **sampling):
            sys.stdout.write(delta)
            sys.stdout.flush()
        sys.stdout.write("\n")
        g = out[0]
    else:
        g = llm.generate(message, max_new_tokens=n, **sampling)
        assert not isinstance(g, list)
        print(g.text)
    t = g.timing
    accepted = f", drafts accepted {t.accepted_tokens}/{t.draft_tokens}" if t.draft_tokens else ""
    print(
        f"[{len(g.token_ids)} tokens, {g.finish_reason}; prefill {t.prefill_tok_s:.1f} tok/s, decode {t.decode_tok_s:.1f} tok/s, engine {llm.engine}{accepted}]",
        file=sys.stderr,
    )
    return 0


def _perplexity(llm: Any, args: argparse.Namespace) -> int:
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: {args.file}: {exc}", file=sys.stderr)
        return 2
    ids = llm.encode(text)
    need = 2 * args.ctx  # llama-perplexity's minimum, so both tools score the same chunks
    if len(ids) < need:
        print(
            f"error: {args.file} is {len(ids)} tokens; a context of {args.ctx} needs at least {need}", file=sys.stderr
        )
        return 2
    try:
        result = llm.score(ids, ctx=args.ctx, stride=args.stride)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"model      {llm.path} ({llm.quant}, engine {llm.engine})")
    mode = f"stride {args.stride}" if args.stride else "chunks, second half scored"
    print(f"text       {args.file}: {len(ids)} tokens, {result.windows} windows of {args.ctx} ({mode})")
    print(",".join(f"[{i + 1}]{p:.4f}" for i, p in enumerate(result.chunk_perplexities)))
    print(f"Final estimate: PPL = {result.perplexity:.4f} +/- {result.perplexity_stderr:.5f} ({result.scored} tokens)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tb_llm", description="Run Hugging Face decoder checkpoints with TorchBurn."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)

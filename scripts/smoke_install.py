"""Smoke test of an installed TorchBurn: the plugins load, the README model matches eager on each engine.

    python scripts/smoke_install.py --expect native_cpu,wgpu      # plugins that must be there
    python scripts/smoke_install.py --expect llm                  # also: tiny checkpoint + generate
    python scripts/smoke_install.py --expect-incompatible future  # a plugin that must be refused

Run by `nox -s alacarte` in fresh virtual environments made from the wheels in dist/, and by
cibuildwheel as the test of each compiled wheel. It imports what is installed, never the source tree,
and checks that: every plugin in --expect loaded; no other plugin is broken; each engine a plugin
provides is available and compiles the README model to the eager answer (rtol=atol=1e-4) with at
least one op run natively; the default choice (no engine named) does the same; with tb-llm, a tiny
random Llama checkpoint generates the same greedy tokens as transformers; with turbo_torch, the
drop-in gives torch's answer. Exit status 0 only if all of it holds.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import warnings
from typing import Any


def fail(message: str) -> None:
    print(f"FAIL: {message}", file=sys.stderr)
    raise SystemExit(1)


def check_installed_not_source() -> None:
    import torchburn

    where = pathlib.Path(torchburn.__file__).resolve()
    if "site-packages" not in where.parts and "dist-packages" not in where.parts:
        fail(f"torchburn imported from {where}, not from an installed wheel")
    print(f"torchburn {torchburn.__version__} from {where.parent}")


def check_plugins(expect: list[str], incompatible: list[str]) -> dict[str, Any]:
    from torchburn.plugins import state

    st = state()
    records = {r.name: r for r in st.records}
    for r in st.records:
        print(f"plugin {r.name:16} {r.distribution} {r.version}: {r.status} {r.reason} engines={r.engines}")
    for name in expect:
        if name not in records:
            fail(f"plugin {name!r} is not installed (entry points: {sorted(records)})")
        if records[name].status != "loaded":
            fail(f"plugin {name!r} did not load: {records[name].status}: {records[name].reason}")
    for name in incompatible:
        rec = records.get(name)
        if rec is None:
            fail(f"plugin {name!r} is not installed")
        if rec.status != "incompatible":
            fail(f"plugin {name!r} should be refused as incompatible, is {rec.status!r} ({rec.reason})")
        from torchburn import PLUGIN_API_VERSION

        # The message must tell the user what to install: both API versions and the distribution.
        for part in (f"provides API {PLUGIN_API_VERSION}", f"plugin API {PLUGIN_API_VERSION + 1}", rec.distribution):
            if part not in rec.reason:
                fail(f"refusal of {name!r} does not say {part!r}: {rec.reason!r}")
        print(f"refused as expected: {rec.reason}")
    unexpected = [r for r in st.records if r.status != "loaded" and r.name not in incompatible]
    if unexpected:
        fail("plugins not loaded: " + "; ".join(f"{r.name}: {r.status} {r.reason}" for r in unexpected))
    extra = sorted(set(records) - set(expect) - set(incompatible))
    if extra:
        fail(f"plugins installed that this environment should not have: {extra}")
    return {name: rec.engine for name, rec in st.engines.items()}


def check_readme_model(engines: dict[str, Any]) -> None:
    import torch

    import torchburn

    # The README model, written out: torchburn.testing needs pytest, which a user install lacks.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).eval()
    x = torch.randn(32, 512)
    with torch.no_grad():
        expected = model(x)
    runs: list[tuple[str, dict[str, str]]] = [("default", {})]
    for name, engine in sorted(engines.items()):
        available = engine.is_available()
        if not available.ok:
            fail(f"engine {name!r} is installed but not available: {available.reason}")
        if len(engines) > 1:  # with one engine the default choice is that engine: compile once
            runs.append((name, {"engine": name}))
    for label, options in runs:
        torch._dynamo.reset()
        torchburn.reset_stats()
        compiled = torch.compile(model, backend="torchburn", options=options)
        with torch.no_grad():
            actual = compiled(x)
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
        cov = torchburn.op_coverage(by_engine=True)
        # delegated: an engine took the node but ran PyTorch's kernel (cython_dispatch does)
        native = {**cov["native"], **cov["delegated"]}
        if engines and not native:
            fail(f"README model on {label}: no engine took an op although engines are installed")
        if not engines and native:
            fail(f"README model ran in an engine ({native}) with no engine installed")
        print(f"README model on {label:16} matches eager; engine ops: {sorted(native) or 'none (eager fallback)'}")
    print(f"active engines: {torchburn.active_engines() or ['eager']}")


def check_turbo_torch() -> None:
    import torch

    import turbo_torch

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    fast = turbo_torch.nn.Sequential(turbo_torch.nn.Linear(16, 32), turbo_torch.nn.ReLU(), turbo_torch.nn.Linear(32, 4))
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(8, 16)
    for _ in range(3):  # the first call fills the dispatch cache, the next ones hit it
        if not torch.equal(fast(x), ref(x)):
            fail("turbo_torch.nn.Sequential differs from torch.nn.Sequential")
    import tb_cython_dispatch

    if not tb_cython_dispatch.COMPILED_AVAILABLE:  # the platform wheel must ship the extension
        from tb_cython_dispatch._impl import COMPILED_IMPORT_ERROR

        fail(f"tb_cython_dispatch._dispatch (the Cython extension) is missing: {COMPILED_IMPORT_ERROR}")
    print(f"turbo_torch matches torch bit for bit, compiled dispatch; cache {turbo_torch.cache_info()}")


def check_llm() -> None:
    from tb_llm import LLM
    from tb_llm.testing import make_checkpoint, reference_greedy

    with tempfile.TemporaryDirectory() as tmp:
        folder = make_checkpoint("llama", pathlib.Path(tmp) / "tiny-llama")
        llm = LLM.from_pretrained(folder, device="cpu")
        out = llm.generate("The quick brown fox", max_new_tokens=8, ignore_eos=True)
        assert not isinstance(out, list)
        want = reference_greedy(folder, out.prompt_token_ids, 8)
        if out.token_ids != want:
            fail(f"tb-llm greedy tokens {out.token_ids} differ from transformers' {want}")
        print(f"tb-llm generated {len(out.token_ids)} tokens equal to transformers' greedy: {out.text!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--expect", default="", help="comma list of plugin entry points that must load")
    parser.add_argument("--expect-incompatible", default="", help="comma list of plugins that must be refused")
    args = parser.parse_args()
    expect = [n for n in args.expect.split(",") if n]
    incompatible = [n for n in args.expect_incompatible.split(",") if n]
    warnings.simplefilter("ignore")  # fallback warnings are expected with tb-core alone
    check_installed_not_source()
    engines = check_plugins(expect, incompatible)
    check_readme_model(engines)
    if "cython_dispatch" in expect:
        check_turbo_torch()
    if "llm" in expect:
        check_llm()
    print("smoke test passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``clover-local doctor``: which engines this machine can run and what to do about a missing one: the
``llama-server`` found (version, backends, devices), every installed llama.cpp runtime and the architectures it
loads beyond the pinned llama.cpp, the llama-cpp-python build's backends, and with ``--model`` the runner the
model runs on, the chat template it is chatted with (and whether it calls tools natively) and the plan next to
llama.cpp's own fit (``llama-fit-params``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clover_local.commands.plan import fit_lines
from clover_local.errors import CloverError, UsageError

if TYPE_CHECKING:
    from clover_local.launch_types import Launch


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "doctor",
        help="check the engines: llama-server, installed runtimes, llama-cpp-python",
        description=(
            "Say whether a llama-server is found and which version and backends it has, which llama.cpp "
            "runtimes are installed and what each loads, which backends the llama-cpp-python build has, and "
            "what to do when something is missing. With --model (or a test --preset) it also says which "
            "runner the model runs on, and runs llama-fit-params to show its choice next to the plan's."
        ),
    )
    parser.add_argument(
        "--model", metavar="PATH", help="a local GGUF: compare the plan with llama-fit-params"
    )
    parser.add_argument("--preset", metavar="NAME", help="preset for the plan (default: clover-35b-a3b)")
    parser.add_argument("--ctx", type=int, metavar="N", help="context size for the plan and the fit")
    parser.add_argument("--llama-server", metavar="PATH", help="check this llama-server binary")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--measure",
        action="store_true",
        help="load the model on this machine's NVIDIA GPU with llama-bench and the embedded engine and put "
        "planned next to real: GPU memory per process (NVML) and decode speed (benchmarks/check_gpu.py)",
    )
    parser.add_argument(
        "--free",
        default="",
        metavar="SIZES",
        help="with --measure: also emulate cards with this much free memory, e.g. 20G,12G (holds the rest)",
    )
    parser.set_defaults(func=run)


def llama_server_report(configured: str | None) -> dict[str, Any]:
    """What is known about the llama-server that ``serve --engine auto`` would use."""
    from clover_local.llamacpp.binary import capabilities, find_llama_server
    from clover_local.runtimes.installed import built_info

    try:
        binary = find_llama_server(configured)
    except CloverError as exc:
        return {"found": False, "error": str(exc)}
    if binary is None:
        return {
            "found": False,
            "fix": "A model only a newer llama.cpp loads runs on an installed runtime's llama-server (below; "
            "`clover-local runtime install` adds the latest release). To use another llama-server for every "
            "model, set CLOVER_LLAMA_SERVER to it. Without one, chat and serve use the embedded engine.",
        }
    report: dict[str, Any] = {"found": True, "path": " ".join(binary.command), "source": binary.source}
    try:
        caps = capabilities(binary.path, binary.subcommand)
    except CloverError as exc:
        report["error"] = str(exc)
        return report
    report.update(
        version=caps.version,
        backends=list(caps.backends),
        devices=list(caps.devices),
        speculative=caps.supports("--spec-type"),
        n_cpu_moe=caps.supports("--n-cpu-moe"),
        tools={
            name: str(p) if (p := binary.sibling(name)) else None
            for name in ("llama-fit-params", "llama-bench")
        },
    )
    info = built_info() if binary.source == "built" else None
    if info:
        report["build_info"] = info
    return report


def runtimes_report() -> list[dict[str, Any]]:
    """Every installed llama.cpp runtime (newest first) and what it loads: how many architectures, and which of
    them the pinned llama.cpp does not know (the models that run on it, not on the embedded engine)."""
    from clover_local.arch_support import packaged_table, runtime_tables
    from clover_local.runtimes.installed import installed_runtimes

    pinned = packaged_table().names
    tables = {t.tag: t.table for t in runtime_tables()}
    out: list[dict[str, Any]] = []
    for rt in installed_runtimes():
        table = tables.get(rt.tag)
        out.append(
            {
                "tag": rt.tag,
                "backend": rt.backend,
                "origin": rt.origin,
                "server": str(rt.server),
                "architectures": len(table.names) if table else None,
                "beyond_pinned": sorted(table.names - pinned) if table else [],
            }
        )
    return out


def llama_cpp_python_report() -> dict[str, Any]:
    from clover_local.detect.build import load_llama_cpp, probe_build

    module, error = load_llama_cpp()
    build, probe = probe_build(module, error)
    report: dict[str, Any] = {
        "version": build.version,
        "backends": list(build.backends),
        "gpu_offload": build.gpu_offload,
        "detail": probe.detail,
    }
    if build.version is None:
        report["fix"] = "Install clover-local again (pipx install clover-local): it brings llama-cpp-python."
    return report


def chat_report(launch: Launch) -> dict[str, Any]:
    """The chat template both engines use for the launch's model, and whether it shows tools itself."""
    from clover_local.engine.templates import renders_tools, tool_support
    from clover_local.launch import chat_template

    choice = chat_template(launch)
    report: dict[str, Any] = {
        "template": choice.name,
        "kind": choice.kind,
        "tool_calls": "native" if renders_tools(choice) else "generic",
        "tool_calls_detail": tool_support(choice),
    }
    if choice.notice:
        report["notice"] = choice.notice
    return report


def measure(args: argparse.Namespace) -> int:
    """Planned vs real on this GPU for the local model (``clover-local doctor --measure``)."""
    from clover_local.detect.units import parse_size
    from clover_local.measure.gpu_check import format_reports, run_case
    from clover_local.model_files import detect, require_model
    from clover_local.presets import load_preset

    frees = []
    for part in (p.strip() for p in args.free.split(",") if p.strip()):
        size = parse_size(part)
        if not size:
            raise UsageError(f"--free: {part!r} is not a size like 12G.")
        frees.append(size)
    if not any(g.vendor == "nvidia" for g in detect().gpus):
        raise UsageError(
            "--measure needs an NVIDIA GPU (it reads each process's GPU memory through NVML); none was found.",
            "Run it on the machine with the GPU; `clover-local plan` shows the plan on any machine.",
        )
    preset = args.preset or "clover-35b-a3b"
    model = require_model(None if args.model else load_preset(preset), args.model)
    engines = ("llama-bench", "embedded")
    reports = [run_case("whole GPU", model, preset=preset, ctx=args.ctx, engines=engines)]
    for free in frees:
        name = f"{free / 1024**3:.0f} GiB free"
        reports.append(
            run_case(
                name, model, preset=preset, free_bytes=free, ctx=args.ctx, engines=(*engines, "fit-params")
            )
        )
    print(format_reports(reports))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.measure:
        return measure(args)
    server = llama_server_report(args.llama_server)
    embedded = llama_cpp_python_report()
    out: dict[str, Any] = {
        "llama_server": server,
        "runtimes": runtimes_report(),
        "llama_cpp_python": embedded,
    }
    if args.model or args.preset:
        from clover_local.launch import LaunchRequest, decide_launch
        from clover_local.llamacpp.fit_params import compare_fit
        from clover_local.model_files import require_model
        from clover_local.presets import load_preset

        model = require_model(None if args.model else load_preset(args.preset), args.model)
        request = LaunchRequest(args.preset, str(model), ctx=args.ctx, llama_server=args.llama_server)
        launch = decide_launch(request)
        out["runner"] = {"kind": launch.runner.kind, "why": launch.runner.why}
        out["chat"] = chat_report(launch)
        fit_params = (server.get("tools") or {}).get("llama-fit-params")
        out["fit"] = {"shown": False, "why": "no llama-fit-params next to llama-server or on PATH"}
        if fit_params:
            out["fit"] = compare_fit(launch.plan, launch.preset, binary=Path(fit_params))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print("\n".join(_text(out)))
    return 0


def _text(out: dict[str, Any]) -> list[str]:
    s, e = out["llama_server"], out["llama_cpp_python"]
    lines = ["llama-server (CLOVER_LLAMA_SERVER, --llama-server, the pinned build or PATH)"]
    if not s["found"]:
        if "error" in s:
            lines.append(f"  -> {s['error']}")
        elif out["runtimes"]:
            lines.append(
                "  none besides the installed runtimes' (below): each model runs on the one that loads it"
            )
        else:
            lines += ["  none", f"  -> {s['fix']}"]
    else:
        lines.append(f"  path      {s['path']} ({s['source']})")
        if "error" in s:
            lines.append(f"  error     {s['error']}")
        else:
            lines.append(f"  version   {s['version']}")
            lines.append(f"  backends  {', '.join(s['backends'])}")
            lines += [f"  device    {d}" for d in s["devices"]]
            lines.append(f"  self-speculative decoding: {'yes' if s['speculative'] else 'no (old build)'}")
            for name, path in s["tools"].items():
                lines.append(f"  {name:<17} {path or 'not next to this llama-server'}")
    lines += ["", "installed llama.cpp runtimes (clover-local runtime list)"]
    if not out["runtimes"]:
        lines.append("  none: `clover-local runtime install` adds the latest release when a model needs it")
    for rt in out["runtimes"]:
        lines.append(f"  {rt['tag']:<9} {rt['backend']}, {rt['origin']}: {rt['server']}")
        if rt["architectures"] is None:
            lines.append("            loads: unknown (its llama-arch.cpp cannot be read; install it again)")
            continue
        beyond = ", ".join(rt["beyond_pinned"]) or "none"
        lines.append(
            f"            loads {rt['architectures']} architectures; beyond the pinned llama.cpp: {beyond}"
        )
    lines += ["", "llama-cpp-python (embedded engine)"]
    lines.append(f"  version   {e['version'] or 'not installed'}")
    lines.append(f"  backends  {', '.join(e['backends'])}")
    if e.get("fix"):
        lines.append(f"  -> {e['fix']}")
    if "runner" in out:
        lines += ["", f"this model runs on: {out['runner']['kind']} ({out['runner']['why']})"]
    if "chat" in out:
        chat = out["chat"]
        lines += ["", "chat (both engines)"]
        lines.append(f"  template  {chat['template']} ({chat['kind']})")
        lines.append(f"  tools     {chat['tool_calls_detail']}")
        if chat.get("notice"):
            lines.append(f"  note      {chat['notice']}")
    if "fit" in out:
        lines += ["", "plan vs llama.cpp's own fit (llama-fit-params)", *fit_lines(out["fit"])]
    return lines

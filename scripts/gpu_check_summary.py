"""The section of docs/gpu-validation.md for one run of scripts/gpu_check.py, from its summary.json.

    python scripts/gpu_check_summary.py OUT_DIR_OR_SUMMARY_JSON >> docs/gpu-validation.md
    python scripts/gpu_check_summary.py --brief OUT_DIR_OR_SUMMARY_JSON     # one row per step

Device, driver, torch and CUDA versions first, one row per step, then every step with every figure
(value, unit, source) and every check (value, threshold, result). Numbers are printed with 4
significant digits (whole numbers from 10,000 up).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULT = {True: "pass", False: "**FAIL**", None: "n/a"}


def fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def cell(text: Any, limit: int = 160) -> str:
    """A table cell: one line, pipes escaped, long text cut."""
    s = " ".join(str(text).split()).replace("|", "\\|")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def brief(d: dict[str, Any]) -> str:
    """One row per step: status, time, how many checks passed, failed or did not apply, and the failed
    checks with their values (what the console shows at the end, and a short record)."""
    lines = ["| step | status | s | checks pass / fail / n/a | failed, or why not run |", "|---|---|---|---|---|"]
    for step in d.get("steps", []):
        checks = step.get("checks", [])
        n = [sum(1 for c in checks if c["ok"] is v) for v in (True, False, None)]
        why = "; ".join(f"{c['name']}: {fmt(c['value'])} {c['unit']} (asked {c['threshold']})".replace("  ", " ")
                        for c in checks if c["ok"] is False) or step.get("reason", "")
        lines.append(f"| {step['name']} | {step['status']} | {fmt(step.get('wall_s'))} | {n[0]} / {n[1]} / {n[2]} "
                     f"| {cell(why, 300)} |")
    return "\n".join(lines) + "\n"


def markdown(d: dict[str, Any]) -> str:
    env, setup = d.get("env") or {}, d.get("setup") or {}
    counts = d.get("counts") or {}
    day = str(d.get("created", ""))[:10]
    device = env.get("device_name") or env.get("smi_name") or d.get("device", "?")
    lines = [
        f"## {day} — {device}: `scripts/gpu_check.sh`{' (plan only)' if d.get('mode') == 'plan' else ''}",
        "",
        f"{len(d.get('steps', []))} steps on `{d.get('device')}` in {fmt(d.get('wall_s'))} s of a "
        f"{fmt(d.get('budget_s'))} s budget: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + ".",
        "",
        "| | |",
        "|---|---|",
        f"| device | {cell(device)}" + (f" ({fmt(env.get('device_memory_bytes'))} B, {fmt(env.get('sm_count'))} SMs, "
                                         f"capability {env.get('capability')})" if env.get("capability") else "") + " |",
        f"| driver / CUDA (torch's) / cuDNN / NCCL | {fmt(env.get('driver'))} / {fmt(env.get('torch_cuda'))} / "
        f"{fmt(env.get('cudnn'))} / {fmt(env.get('nccl'))} |",
        f"| Python / torch / triton / transformers | {fmt(env.get('python'))} / {fmt(env.get('torch'))} / "
        f"{fmt(env.get('triton'))} / {fmt(env.get('transformers'))} |",
        f"| lmprof | {fmt(env.get('lmprof'))}, C trace reader: {fmt(env.get('lmprof_native_reader'))} |",
    ]
    if setup:
        lines.append(f"| set-up | {cell(', '.join(f'{k}: {v}' for k, v in setup.items()), 300)} |")
    lines += ["", brief(d).rstrip("\n")]
    quiet = [s for s in d.get("steps", []) if s["status"] == "skipped" or (s["status"] == "planned" and not s["checks"])]
    for step in d.get("steps", []):
        if step in quiet:
            continue
        lines += ["", f"### {step['name']}: {step['title']} — {step['status']}"
                  + (f" ({fmt(step['wall_s'])} s)" if step.get("wall_s") else "")]
        if step.get("reason"):
            lines += ["", f"{cell(step['reason'], 400)}"]
        if step.get("checks"):
            lines += ["", "| check | value | asked | result | note |", "|---|---|---|---|---|"]
            for c in step["checks"]:
                lines.append(f"| {cell(c['name'])} | {cell(fmt(c['value']) + (' ' + c['unit'] if c['unit'] and c['value'] is not None else ''))} "
                             f"| {cell(c['threshold'])} | {RESULT[c['ok']]} | {cell(c['note'])} |")
        if step.get("figures"):
            lines += ["", "| figure | value | unit | source | note |", "|---|---|---|---|---|"]
            for f in step["figures"]:
                lines.append(f"| {cell(f['name'])} | {cell(fmt(f['value']))} | {f['unit']} | {f['source']} "
                             f"| {cell(f['note'])} |")
    if quiet:
        lines += ["", "Not run: " + "; ".join(f"{s['name']} ({s['reason'] or s['status']})" for s in quiet) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    short = "--brief" in argv
    argv = [a for a in argv if a != "--brief"]
    if len(argv) != 1:
        print("usage: python scripts/gpu_check_summary.py [--brief] OUT_DIR_OR_SUMMARY_JSON", file=sys.stderr)
        return 2
    path = Path(argv[0])
    path = path / "summary.json" if path.is_dir() else path
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"gpu_check_summary: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_check import validate_summary

    errors = validate_summary(data, fixed_steps=False)
    if errors:
        print(f"gpu_check_summary: {path} is not a gpu_check summary ({'; '.join(errors[:3])})", file=sys.stderr)
        return 2
    sys.stdout.write(brief(data) if short else markdown(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

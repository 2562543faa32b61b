"""Ratios, the issue's targets, and the printed / JSON / Markdown renderings of one benchmark run.

The results dict (built by :mod:`bench.run`) looks like::

    {"meta": {...}, "config": {...},
     "nonstreaming": {name: {"label", "status", "reason", "points": {"1": LoadResult, "64": ...}}},
     "streaming": {name: {"label", "status", "reason", "result": StreamResult,
                          "paired_direct": StreamResult, "delta_p50_ms", "delta_p99_ms"}}}

Each streaming target's rounds alternate with rounds straight to the mock worker; ``delta_*`` are
against that paired baseline (the ``direct`` entry is a run of its own). ``status`` is ``ok``, ``skipped`` (a peer that is not installed or did not start) or ``failed``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = [
    "GATEWAYS",
    "TARGET_P50_C1_MS",
    "TARGET_RPS_FALLBACK",
    "TARGET_SMG_SHARE",
    "TARGET_TTFB_DELTA_MS",
    "render_markdown",
    "render_text",
    "summarize",
    "update_doc",
    "write_json",
]

GATEWAYS = ("gateway-uvicorn", "gateway-daphne")
TARGET_SMG_SHARE = 0.25
TARGET_RPS_FALLBACK = 2000.0
TARGET_P50_C1_MS = 0.8
TARGET_TTFB_DELTA_MS = 2.0
BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"

Results = dict[str, Any]


def _point(results: Results, name: str, conc: int) -> dict[str, Any] | None:
    entry = results["nonstreaming"].get(name)
    if not entry or entry.get("status") != "ok":
        return None
    point = entry["points"].get(str(conc))
    return point if isinstance(point, dict) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def _diff(a: float | None, b: float | None) -> float | None:
    return round(a - b, 4) if a is not None and b is not None else None


def summarize(results: Results) -> dict[str, Any]:
    """Ratios per gateway server and the targets with pass/fail (``None`` when not measurable)."""
    conc = sorted(int(c) for c in results["config"]["connections"])
    low, high = conc[0], conc[-1]

    def metric(name: str, c: int, key: str) -> float | None:
        point = _point(results, name, c)
        return None if point is None else float(point[key])

    ratios: dict[str, dict[str, float | None]] = {}
    for gw in GATEWAYS:
        row: dict[str, float | None] = {}
        for peer in ("worker", "smg", "litellm"):
            row[f"rps_c{high}_vs_{peer}"] = _ratio(metric(gw, high, "rps"), metric(peer, high, "rps"))
            row[f"rps_c{low}_vs_{peer}"] = _ratio(metric(gw, low, "rps"), metric(peer, low, "rps"))
            row[f"p50_c{low}_minus_{peer}_ms"] = _diff(metric(gw, low, "p50_ms"), metric(peer, low, "p50_ms"))
        entry = results.get("streaming", {}).get(gw, {})
        if entry.get("status") == "ok":
            row["ttfb_p50_minus_direct_ms"] = entry["delta_p50_ms"]
            row["ttfb_p99_minus_direct_ms"] = entry["delta_p99_ms"]
        ratios[gw] = row

    smg_rps = metric("smg", 64, "rps")
    rps_threshold = TARGET_SMG_SHARE * smg_rps if smg_rps else TARGET_RPS_FALLBACK
    rps_basis = (
        f">= {TARGET_SMG_SHARE:.0%} of smg's {smg_rps:,.0f} req/s"
        if smg_rps
        else f">= {TARGET_RPS_FALLBACK:,.0f} req/s (smg not measured)"
    )
    targets: list[dict[str, Any]] = []
    measured = [gw for gw in GATEWAYS if gw in results["nonstreaming"] or gw in results.get("streaming", {})]
    for gw in measured:
        rps = metric(gw, 64, "rps")
        p50 = metric(gw, 1, "p50_ms")
        delta = ratios[gw].get("ttfb_p50_minus_direct_ms")
        targets += [
            _target(gw, "req/s at c=64", rps, rps_threshold, rps is not None and rps >= rps_threshold, rps_basis),
            _target(gw, "p50 at c=1 (ms)", p50, TARGET_P50_C1_MS, p50 is not None and p50 <= TARGET_P50_C1_MS,
                    f"<= {TARGET_P50_C1_MS} ms"),
            _target(gw, "TTFB p50 vs direct, 32 streams (ms)", delta, TARGET_TTFB_DELTA_MS,
                    delta is not None and delta <= TARGET_TTFB_DELTA_MS, f"<= +{TARGET_TTFB_DELTA_MS} ms"),
        ]
    return {"ratios": ratios, "targets": targets}


def _target(gw: str, what: str, value: float | None, threshold: float, ok: bool, basis: str) -> dict[str, Any]:
    return {
        "gateway": gw,
        "metric": what,
        "value": value,
        "threshold": round(threshold, 3),
        "rule": basis,
        "pass": None if value is None else ok,
    }


# --- rendering -----------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _verdict(flag: bool | None) -> str:
    return "n/a" if flag is None else ("PASS" if flag else "FAIL")


def _nonstreaming_rows(results: Results) -> tuple[list[str], list[list[str]], list[str]]:
    conc = sorted(int(c) for c in results["config"]["connections"])
    header = ["target"]
    for c in conc:
        header += [f"c={c} req/s", f"c={c} p50 ms", f"c={c} p99 ms"]
    rows: list[list[str]] = []
    notes: list[str] = []
    for name, entry in results["nonstreaming"].items():
        if entry["status"] != "ok":
            notes.append(f"{entry['label']}: {entry['status']} - {entry.get('reason', '')}")
            continue
        row = [entry["label"]]
        for c in conc:
            point = entry["points"].get(str(c))
            if point is None:
                row += ["-", "-", "-"]
                continue
            flag = "*" if point["errors"] or point["non_2xx"] else ""
            row += [_num(point["rps"], 0) + flag, _num(point["p50_ms"]), _num(point["p99_ms"])]
        rows.append(row)
    return header, rows, notes


def _streaming_rows(results: Results) -> tuple[list[str], list[list[str]], list[str]]:
    header = [
        "target",
        "TTFB p50 ms",
        "TTFB p99 ms",
        "paired direct p50 ms",
        "p50 vs direct",
        "p99 vs direct",
        "headers p50 ms",
        "stream p50 ms",
        "errors",
    ]
    rows: list[list[str]] = []
    notes: list[str] = []
    for name, entry in results.get("streaming", {}).items():
        if entry["status"] != "ok":
            notes.append(f"{entry['label']}: {entry['status']} - {entry.get('reason', '')}")
            continue
        r = entry["result"]
        paired = entry.get("paired_direct")
        rows.append(
            [
                entry["label"],
                _num(r["ttfb_p50_ms"], 2),
                _num(r["ttfb_p99_ms"], 2),
                _num(paired["ttfb_p50_ms"], 2) if paired else "",
                f"{entry['delta_p50_ms']:+.2f}" if paired else "",
                f"{entry['delta_p99_ms']:+.2f}" if paired else "",
                _num(r["headers_p50_ms"], 2),
                _num(r["total_p50_ms"], 1),
                str(r["errors"]),
            ]
        )
    return header, rows, notes


def _ratio_lines(results: Results, summary: dict[str, Any]) -> list[str]:
    conc = sorted(int(c) for c in results["config"]["connections"])
    low, high = conc[0], conc[-1]
    lines = []
    names = {"worker": "direct (nginx)", "smg": "smg", "litellm": "LiteLLM"}
    for gw, row in summary["ratios"].items():
        label = results["nonstreaming"].get(gw, {}).get("label", gw)
        for peer, peer_name in names.items():
            hi, lo = row.get(f"rps_c{high}_vs_{peer}"), row.get(f"rps_c{low}_vs_{peer}")
            added = row.get(f"p50_c{low}_minus_{peer}_ms")
            if hi is None and lo is None:
                continue
            lines.append(
                f"{label} vs {peer_name}: req/s x{_num(hi, 2)} at c={high}, x{_num(lo, 2)} at c={low}; "
                f"p50 at c={low} {added:+.3f} ms" if added is not None else f"{label} vs {peer_name}: req/s x{_num(hi, 2)}"
            )
        if row.get("ttfb_p50_minus_direct_ms") is not None:
            lines.append(
                f"{label} streaming TTFB vs direct: p50 {row['ttfb_p50_minus_direct_ms']:+.2f} ms, "
                f"p99 {row['ttfb_p99_minus_direct_ms']:+.2f} ms"
            )
    return lines


def _target_lines(summary: dict[str, Any], results: Results) -> list[str]:
    lines = []
    for t in summary["targets"]:
        label = results["nonstreaming"].get(t["gateway"], {}).get("label", t["gateway"])
        value = "-" if t["value"] is None else (f"{t['value']:,.0f}" if "req/s" in t["metric"] else f"{t['value']:.3f}")
        lines.append(f"[{_verdict(t['pass'])}] {label}: {t['metric']} = {value} (target {t['rule']})")
    return lines


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        return "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row))

    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)])


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render_text(results: Results, summary: dict[str, Any]) -> str:
    cfg = results["config"]
    out = [
        f"Non-streaming chat: wrk -t{cfg['wrk_threads']} {cfg['duration_s']:g} s per point"
        f"{' (best of ' + str(cfg['repeat']) + ')' if cfg.get('repeat', 1) > 1 else ''} "
        f"(+{cfg['warmup_s']:g} s warm-up); target on core {cfg['target_core']}"
        f"{_processes(cfg)}, "
        f"wrk + nginx worker on core {cfg['load_core']}  (* = errors or non-2xx seen)",
    ]
    header, rows, notes = _nonstreaming_rows(results)
    out += [_text_table(header, rows), *(f"  {n}" for n in notes), ""]
    if results.get("streaming"):
        out.append(
            f"Streaming TTFB: {cfg['streams']} concurrent streams x {cfg['stream_rounds']} rounds, "
            f"mock worker --tokens {cfg['stream_tokens']} --delay-ms {cfg['stream_delay_ms']:g} (core {cfg['load_core']})"
        )
        header, rows, notes = _streaming_rows(results)
        out += [_text_table(header, rows) if rows else "  (no streaming results)", *(f"  {n}" for n in notes), ""]
    out += ["Ratios:", *(f"  {line}" for line in _ratio_lines(results, summary)), ""]
    out += ["Targets:", *(f"  {line}" for line in _target_lines(summary, results))]
    return "\n".join(out)


def render_markdown(results: Results, summary: dict[str, Any]) -> str:
    meta, cfg = results["meta"], results["config"]
    peers = ", ".join(f"{k} {v}" for k, v in meta.get("peer_versions", {}).items()) or "none installed"
    out = [
        BEGIN,
        "<!-- Generated by `make bench` (bench/run.py); edits between these markers are overwritten. -->",
        f"### Latest results ({meta['date']})",
        "",
        f"- Machine: {meta['cpu']}, {meta['cores']} cores, Linux {meta['kernel']}, Python {meta['python']}; "
        f"load average {meta.get('loadavg_start', '?')} at start, {meta.get('loadavg_end', '?')} at the end",
        f"- Tools: {meta['nginx']}, {meta['wrk']}; peers: {peers}",
        f"- Commit: `{meta['commit']}`{' (uncommitted changes)' if meta.get('dirty') else ''}",
        f"- Non-streaming: wrk -t{cfg['wrk_threads']}, {cfg['duration_s']:g} s per point"
        f"{' (best of ' + str(cfg['repeat']) + ' runs)' if cfg.get('repeat', 1) > 1 else ''} after a "
        f"{cfg['warmup_s']:g} s warm-up; target on core {cfg['target_core']}{_processes(cfg)}, wrk and the nginx worker on core "
        f"{cfg['load_core']}.",
        "",
    ]
    header, rows, notes = _nonstreaming_rows(results)
    out += [_md_table(header, rows), ""]
    out += [f"- {n}" for n in notes] + ([""] if notes else [])
    if results.get("streaming"):
        out += [
            f"Streaming: {cfg['streams']} concurrent streams x {cfg['stream_rounds']} rounds; mock worker "
            f"`--tokens {cfg['stream_tokens']} --delay-ms {cfg['stream_delay_ms']:g}` and the client on core "
            f"{cfg['load_core']}, the target on core {cfg['target_core']}. TTFB = request sent to first SSE bytes. "
            "Each target's rounds alternate with rounds straight to the worker; the deltas are against that "
            "paired baseline.",
            "",
        ]
        header, rows, notes = _streaming_rows(results)
        out += [_md_table(header, rows) if rows else "(no streaming results)", ""]
        out += [f"- {n}" for n in notes] + ([""] if notes else [])
    out += ["Ratios:", "", *(f"- {line}" for line in _ratio_lines(results, summary)), ""]
    out += ["Targets:", "", *(f"- {line}" for line in _target_lines(summary, results)), "", END]
    return "\n".join(out)


def update_doc(path: Path, section: str, template: str) -> None:
    """Replace the text between the markers in ``path`` (created from ``template`` if missing)."""
    text = path.read_text() if path.exists() else template
    if BEGIN in text and END in text:
        pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
        text = pattern.sub(lambda _m: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n## Results\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_json(path: Path, results: Results, summary: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**results, "summary": summary}, indent=2) + "\n")


def _processes(cfg: dict[str, Any]) -> str:
    """How many serving processes the gateway ran (multi-core mode), for the report's lines."""
    workers = int(cfg.get("gateway_workers") or 1)
    return f" (gateway --workers {workers})" if workers > 1 else ""

"""Run every benchmark, write ``bench/results.json`` and print the ratio table.

    python -m bench.run            # the full run (about 10 minutes on 2 cores)
    python -m bench.run --quick    # fewer rounds, for a smoke test
    python -m bench.run --only mlp cnn

Ratios come first: every ratio compares implementations measured side by side in this run
on this machine. Absolute figures follow; they drift on shared machines, the ratios hold.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

WORKLOADS = ("capture_step", "trainer_step", "mlp", "long_run", "cnn", "fit_overhead", "first_step")
RESULTS = Path(__file__).resolve().parent / "results.json"


def environment() -> dict:
    import numpy
    import onnx

    import ortrain as ot
    info = {"python": platform.python_version(), "machine": platform.machine(), "cores": os.cpu_count(),
            "ortrain": ot.__version__, "onnxruntime-training": ot.engine.ORT_VERSION, "onnx": onnx.__version__,
            "numpy": numpy.__version__, "threads": ot.get_num_threads()}
    try:
        import torch
        info["torch"] = torch.__version__
    except ImportError:
        info["torch"] = None
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu"] = platform.processor()
    return info


def _x(r: dict | None) -> str:
    return "-" if r is None else f"{r['median']:.2f}x ({r['p10']:.2f}-{r['p90']:.2f})"


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "**no**")


def rows(results: dict) -> list[tuple]:
    """(workload, comparison, ratio, goal, met, absolute) rows of the summary table."""
    out = []
    r = results.get("capture_step")
    if r:
        over = r["ratios"]["ortrain_over_ort_loop"]
        speed = r["ratios"].get("torch_over_ortrain")
        us = r["us_per_call"]
        absolute = ", ".join(f"{n} {s['median']:.1f} us" for n, s in us.items())
        out.append(("(a) captured step", "time / raw ORT-training loop", _x(over), "<= 1.15x",
                    _met(over["median"] <= 1.15), absolute))
        out.append(("(a) captured step", "PyTorch eager time / ortrain", _x(speed), ">= 8x",
                    _met(None if speed is None else speed["median"] >= 8), ""))
    r = results.get("trainer_step")
    if r:
        us = {n: s for n, s in r["us_per_call"].items() if n != "train_on_batch"}
        out.append(("(b) Trainer.step 4-8-2", "time / raw ORT-training loop", _x(r["ratios"]["ortrain_time_over_ort_loop"]),
                    "-", "-", ", ".join(f"{n} {s['median']:.1f} us" for n, s in us.items())))
        if "speedup_vs_torch" in r["ratios"]:
            out.append(("(b) Trainer.step 4-8-2", "PyTorch eager time / ortrain", _x(r["ratios"]["speedup_vs_torch"]),
                        "-", "-", ""))
        tob = r["ratios"].get("train_on_batch_over_step")
        if tob:
            out.append(("(b) train_on_batch 4-8-2", "time / Trainer.step", _x(tob), "-", "-",
                        f"train_on_batch {r['us_per_call']['train_on_batch']['median']:.1f} us (keeps its trainer "
                        "between calls)"))
            if "torch_over_train_on_batch" in r["ratios"]:
                out.append(("(b) train_on_batch 4-8-2", "PyTorch eager time / ortrain",
                            _x(r["ratios"]["torch_over_train_on_batch"]), "-", "-", ""))
    r = results.get("mlp")
    if r:
        sps = r["samples_per_s"]
        absolute = ", ".join(f"{n} {v:,.0f} samples/s" for n, v in sps.items())
        speed = r["ratios"].get("speedup_vs_torch")
        out.append(("(c) MLP 784-512-512-10", "samples/s over PyTorch eager", _x(speed), ">= 1.5x",
                    _met(None if speed is None else speed["median"] >= 1.5), absolute))
        frac = r["fraction_of_sgemm"]
        out.append(("(c) MLP 784-512-512-10", "fraction of numpy sgemm (1024^2 / step shapes)",
                    f"{frac['square_1024']:.2f} / {frac['step_shapes']:.2f}", ">= 0.6",
                    _met(frac["square_1024"] >= 0.6),
                    f"ortrain {r['ortrain_gflops']:.0f} GFLOP/s; sgemm {r['sgemm_gflops']['square_1024']:.0f} / "
                    f"{r['sgemm_gflops']['step_shapes']:.0f} GFLOP/s"))
        fl = r.get("floor")
        if fl and "torch_over_floor" in fl:
            out.append(("(c) MLP 784-512-512-10", "machine floor: PyTorch eager time / a step at numpy's rates",
                        _x(fl["torch_over_floor"]), "-", "-",
                        f"floor {1e3 * fl['seconds']:.2f} ms = GEMMs {1e3 * fl['gemm_s']:.2f} ms at the 1024^2 "
                        f"sgemm rate + Adam {1e3 * fl['adam_s']:.2f} ms at {fl['bandwidth_gbs']:.0f} GB/s; "
                        f"its fraction of sgemm {fl['fraction_of_sgemm']:.2f}; ortrain "
                        f"{r['ms_per_step']['ortrain']['median']:.2f} ms"))
        out.append(("(c) MLP 784-512-512-10", "time / raw ORT-training loop",
                    _x(r["ratios"]["ortrain_time_over_ort_loop"]), "-", "-", ""))
        raw = r["ratios"].get("torch_over_ort_loop")
        if raw and "ort_loop_fraction_of_sgemm" in r:
            out.append(("(c) MLP 784-512-512-10", "the runtime alone: raw ORT-training loop's samples/s over "
                        "PyTorch eager; its fraction of sgemm (1024^2)",
                        f"{_x(raw)}; {r['ort_loop_fraction_of_sgemm']:.2f}", "-", "-",
                        "the most any loop over onnxruntime-training's sessions reaches on this machine"))
        rss = r["peak_rss_mb"]
        ratio = r["ratios"].get("rss_ortrain_over_torch")
        out.append(("(g) peak memory of (c)", "ortrain RSS / PyTorch RSS", "-" if ratio is None else f"{ratio:.2f}",
                    "<= 1.0", _met(None if ratio is None else ratio <= 1.0),
                    ", ".join(f"{n} {v:.0f} MB" for n, v in rss.items())))
    r = results.get("long_run")
    if r:
        ms = r["ms_per_step"]
        grew = r["last_over_first"]
        name = f"(c) MLP, batch 32, {r['steps']:,} steps"
        out.append((name, "last 100 steps' time / first 100's", " / ".join(f"{n} {v:.2f}x" for n, v in grew.items()),
                    "-", "-", ", ".join(f"{n} {m['first']:.2f} -> {m['last']:.2f} ms" for n, m in ms.items())))
        if "torch_over_ortrain_at_end" in r:
            out.append((name, "PyTorch eager time / ortrain, last 100 steps", f"{r['torch_over_ortrain_at_end']:.2f}x",
                        "-", "-", "subnormal Adam moments: ortrain flushes them"))
    r = results.get("cnn")
    if r:
        sps = r["samples_per_s"]
        out.append(("(d) CNN 28x28, batch 64", "samples/s over PyTorch eager", _x(r["ratios"].get("speedup_vs_torch")),
                    "-", "-", ", ".join(f"{n} {v:,.0f} samples/s" for n, v in sps.items())))
        out.append(("(d) CNN 28x28, batch 64", "time / raw ORT-training loop",
                    _x(r["ratios"]["ortrain_time_over_ort_loop"]), "-", "-", ""))
    r = results.get("fit_overhead")
    if r:
        for item in r["results"]:
            e, c, first = item["epoch"], item["call"], item.get("first_epoch")
            steady = item.get("steady_epochs")  # results written before the steady epochs were timed have none
            which = "epoch time" if steady is None else f"time of epochs {steady[0] + 1}-{steady[-1] + 1} of {item['epochs']}"
            out.append((f"(e) fit_generator {item['model']}", f"{which} over a plain Trainer.step loop",
                        f"{100 * e['overhead_min']:+.1f}% (paired median {100 * e['overhead_paired_median']:+.1f}%, "
                        f"p10-p90 {100 * e['overhead_p10']:+.1f}% to {100 * e['overhead_p90']:+.1f}%)",
                        "<= +5%", _met(e["overhead_min"] <= 0.05),
                        f"step {item['step_us_plain']:.0f} us; the loop's own Python "
                        f"{item['machinery']['us_per_step']:.1f} us a step ({100 * item['machinery']['overhead']:.2f}%); "
                        + ("" if first is None else
                           f"first epoch, on a session just opened, {100 * first['overhead_min']:+.1f}% (paired median "
                           f"{100 * first['overhead_paired_median']:+.1f}%, p10-p90 {100 * first['overhead_p10']:+.0f}% "
                           f"to {100 * first['overhead_p90']:+.0f}%); ")
                        + f"whole call incl. set-up {100 * c['overhead_min']:+.1f}%"))
    r = results.get("first_step")
    if r:
        for name in ("mlp", "resnet50"):
            m = r[name]
            parts = m.get("warm_parts")
            split = "" if parts is None else (
                f" (medians of its parts: model and data {_secs(parts['model_s'])}, Trainer "
                f"{_secs(parts['trainer_s'])}, first step {_secs(parts['step_s'])}; the next step "
                f"{_secs(parts['next_step_s'])})")
            runs = m.get("warm_runs") or [m["warm_s"]]
            out.append((f"(f) first step, {name}", "warm / cold", f"{m['warm_over_cold']:.2f}", "<= 0.20",
                        _met(m["warm_over_cold"] <= 0.2),
                        f"cold {_secs(m['cold_s'])}, warm {_secs(m['warm_s'])} (runs {_secs(min(runs))} to "
                        f"{_secs(max(runs))}){split}"))
            raw = m.get("runtime_alone")
            if raw:
                out.append((f"(f) first step, {name}", "the runtime alone: its warm start / ortrain's cold",
                            f"{raw['warm_over_cold']:.2f}", "-", "-",
                            f"onnxruntime-training opening the cached artifacts {_secs(raw['open_s'])} + its first "
                            f"step {_secs(raw['step_s'])} = {_secs(raw['warm_s'])}"))
    return out


def _secs(t: float) -> str:
    return f"{t:.2f} s" if t >= 0.1 else f"{1e3 * t:.1f} ms"


def table(results: dict) -> str:
    lines = ["| workload | comparison | ratio (p10-p90) | goal | met | absolute |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows(results)]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=WORKLOADS)
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    results = {"environment": environment(), "quick": args.quick, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for name in args.only or WORKLOADS:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        module = importlib.import_module(f"bench.workloads.{name}")
        results[name] = module.run(quick=args.quick)
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
    Path(args.output).write_text(json.dumps(results, indent=1))
    env = results["environment"]
    print(f"\nortrain {env['ortrain']}, onnxruntime-training {env['onnxruntime-training']}, torch {env['torch']}, "
          f"numpy {env['numpy']}; {env['cores']} cores ({env['cpu']}), {env['threads']} threads\n")
    print(table(results))
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The benchmark harness's own arithmetic: the machine floor of (c) and the table built from a
results file. Timing itself is not tested here; ``make bench`` measures it."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from bench import common, run
from bench.workloads import mlp


def test_memory_bandwidth_counts_three_streams(monkeypatch):
    # Each timed run takes exactly 1 ms of perf_counter, so the rate is bytes / 1 ms.
    ticks = itertools.count(0.0, 1e-3)
    monkeypatch.setattr(common.time, "perf_counter", lambda: next(ticks))
    rate = common.memory_bandwidth(1000, threads=2, seconds=0.0025)
    assert rate == pytest.approx(3 * 4 * 1000 / 1e-3)


def test_machine_floor_adds_gemms_at_peak_and_adams_traffic(monkeypatch):
    monkeypatch.setattr(mlp, "memory_bandwidth", lambda floats, threads=1: 20e9 if threads == 1 else 25e9)
    params = sum(a * b + b for a, b in zip(mlp.SIZES[:-1], mlp.SIZES[1:]))
    floor = mlp.machine_floor(params, peak=300e9, threads=2)
    # forward and weight gradient of every layer, input gradient of all but the first
    gemm_flops = 2 * 128 * (784 * 512 * 2 + 512 * 512 * 3 + 512 * 10 * 3)
    assert floor["gemm_s"] == pytest.approx(gemm_flops / 300e9)
    assert floor["adam_s"] == pytest.approx(28 * 669_706 / 25e9)
    assert floor["seconds"] == pytest.approx(floor["gemm_s"] + floor["adam_s"])
    assert floor["fraction_of_sgemm"] == pytest.approx(6 * 669_706 * 128 / floor["seconds"] / 300e9)


def test_table_renders_every_workload_with_its_goal():
    # a results file as `make bench` writes it (bench/results.json itself is not committed)
    results = json.loads((Path(__file__).parent / "data" / "bench_results.json").read_text())
    results["mlp"]["floor"] = {"seconds": 2e-3, "gemm_s": 1.4e-3, "adam_s": 0.6e-3, "bandwidth_gbs": 30.0,
                               "fraction_of_sgemm": 0.8,
                               "torch_over_floor": {"median": 1.7, "p10": 1.6, "p90": 1.8, "n": 15}}
    table = run.table(results)
    lines = table.splitlines()
    assert lines[0].startswith("| workload | comparison | ratio")
    for label in ("(a) captured step", "(b) Trainer.step", "(c) MLP", "(d) CNN", "(e) fit_generator",
                  "(f) first step, mlp", "(f) first step, resnet50", "(g) peak memory"):
        assert any(line.startswith(f"| {label}") for line in lines), label
    floor_row = next(line for line in lines if "machine floor" in line)
    assert "1.70x (1.60-1.80)" in floor_row and "floor 2.00 ms = GEMMs 1.40 ms" in floor_row
    # train_on_batch's rows appear where its worker ran (results from before it ran have none)
    assert not any(line.startswith("| (b) train_on_batch") for line in lines)
    tb = results["trainer_step"]
    tb["us_per_call"]["train_on_batch"] = {"median": 450.0, "p10": 400.0, "p90": 500.0}
    tb["ratios"]["train_on_batch_over_step"] = {"median": 5.25, "p10": 5.0, "p90": 5.5, "n": 30}
    tb["ratios"]["torch_over_train_on_batch"] = {"median": 0.81, "p10": 0.75, "p90": 0.9, "n": 30}
    lines = run.table(results).splitlines()
    step_row = next(line for line in lines if line.startswith("| (b) Trainer.step") and "raw ORT" in line)
    assert "train_on_batch" not in step_row
    tob = [line for line in lines if line.startswith("| (b) train_on_batch")]
    assert len(tob) == 2 and "5.25x (5.00-5.50)" in tob[0] and "train_on_batch 450.0 us" in tob[0]
    assert "0.81x (0.75-0.90)" in tob[1]
    # (e): the steady epochs' figure is the target's; the first epoch's is shown beside it when measured
    fit_rows = [line for line in lines if line.startswith("| (e) fit_generator")]
    assert len(fit_rows) == 2 and all("| epoch time over a plain Trainer.step loop |" in r for r in fit_rows)
    item = results["fit_overhead"]["results"][0]
    item.update(epochs=5, steady_epochs=[2, 3], epoch={**item["epoch"], "overhead_min": 0.061},
                first_epoch={**item["epoch"], "overhead_min": -0.02, "overhead_paired_median": 0.05,
                             "overhead_p10": -0.31, "overhead_p90": 0.66})
    row = next(line for line in run.table(results).splitlines() if line.startswith("| (e) fit_generator"))
    assert "| time of epochs 3-4 of 5 over a plain Trainer.step loop | +6.1% (" in row and "| **no** |" in row
    assert "first epoch, on a session just opened, -2.0% (paired median +5.0%, p10-p90 -31% to +66%)" in row
    # the runtime alone's rows appear where it was measured (older results have none)
    assert not any("the runtime alone" in line for line in lines)
    results["mlp"]["ratios"]["torch_over_ort_loop"] = {"median": 1.08, "p10": 1.0, "p90": 1.2, "n": 15}
    results["mlp"]["ort_loop_fraction_of_sgemm"] = 0.44
    results["first_step"]["mlp"]["runtime_alone"] = {"warm_s": 0.019, "warm_over_cold": 0.31, "open_s": 0.013,
                                                     "step_s": 0.006, "runs": [0.019, 0.02]}
    alone = [line for line in run.table(results).splitlines() if "the runtime alone" in line]
    assert len(alone) == 2
    assert alone[0].startswith("| (c) MLP") and "| 1.08x (1.00-1.20); 0.44 |" in alone[0]
    assert alone[1].startswith("| (f) first step, mlp") and "| 0.31 |" in alone[1]
    assert "opening the cached artifacts 13.0 ms + its first step 6.0 ms = 19.0 ms" in alone[1]
    # a goal's verdict follows its figure
    speed = results["mlp"]["ratios"]["speedup_vs_torch"]["median"]
    row = next(line for line in lines if line.startswith("| (c) MLP") and "| samples/s over PyTorch eager" in line)
    assert ("| yes |" in row) == (speed >= 1.5)


def test_the_standard_op_adam_the_profile_times_is_adam():
    # one step from given moments, against the update written out in numpy
    import onnxruntime as ort

    from bench.profile import _standard_op_adam
    rng = np.random.default_rng(0)
    w, g, m = (rng.standard_normal(7).astype(np.float32) for _ in range(3))
    v = rng.random(7).astype(np.float32)
    sess = ort.InferenceSession(_standard_op_adam([7], lr=0.01, eps=1e-6).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    w1, m1, v1 = sess.run(["w_new0", "m_new0", "v_new0"], {"w0": w, "g0": g, "m0": m, "v0": v})
    m_ref = 0.9 * m.astype(np.float64) + 0.1 * g
    v_ref = 0.999 * v.astype(np.float64) + 0.001 * g.astype(np.float64) ** 2
    np.testing.assert_allclose(m1, m_ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(v1, v_ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(w1, w - 0.01 * m_ref / (np.sqrt(v_ref) + 1e-6), rtol=1e-6, atol=1e-7)


def test_the_kernel_session_the_profile_times_runs_adam_over_its_weights():
    # the weights' sum times x = 1 against 0 under MSE: each weight's gradient is 2 * sum;
    # one update from zero moments is Adam's first step, written out in numpy
    from bench.profile import _kernel_session
    session = _kernel_session([5, 3])
    try:
        w0 = {name: session.get(name) for name in session.trainable_names}
        assert sorted(w.size for w in w0.values()) == [3, 5]
        grad = 2.0 * sum(float(w.astype(np.float64).sum()) for w in w0.values())
        for name in session.trainable_names:
            np.testing.assert_allclose(session.grad_view(name), grad, rtol=1e-5)
        session.optimizer_step()
        lr, eps = 1e-3, 1e-8
        m = 0.1 * grad / (1 - 0.9)           # bias-corrected first moment
        v = 0.001 * grad ** 2 / (1 - 0.999)  # bias-corrected second moment
        for name, w in w0.items():
            np.testing.assert_allclose(session.get(name), w - lr * m / (np.sqrt(v) + eps), rtol=1e-5, atol=1e-6)
    finally:
        session.free()


def test_the_sampled_profile_counts_each_function_once_and_names_runtime_calls():
    # a frame tree as pyinstrument gives it: a "[self]" child repeats its parent's self time
    from types import SimpleNamespace as F

    from bench.profile import sampled_self_times

    def frame(function, where, self_time, *children):
        return F(function=function, file_path_short=where, total_self_time=self_time, children=list(children))

    root = frame("<module>", "loop.py", 0.5,
                 frame("[self]", "loop.py", 0.5),
                 frame("step", "ortrain/trainer.py", 1.0,
                       frame("PyCapsule.train_step", "<built-in>", 60.0, frame("[self]", "<built-in>", 60.0)),
                       frame("PyCapsule.optimizer_step", "<built-in>", 30.0),
                       frame("ufunc.reduce", "<built-in>", 2.0),
                       frame("check", "ortrain/_arrays.py", 1.5, frame("len", "<built-in>", 0.5))))
    times = sampled_self_times(root)
    assert times == {("<module>", "loop.py"): 0.5, ("step", "ortrain/trainer.py"): 1.0,
                     ("PyCapsule.train_step", "runtime: training graph"): 60.0,
                     ("PyCapsule.optimizer_step", "runtime: optimizer graph"): 30.0,
                     ("ufunc.reduce", "ortrain/trainer.py"): 2.0,  # a built-in goes to the file that called it
                     ("check", "ortrain/_arrays.py"): 1.5, ("len", "ortrain/_arrays.py"): 0.5}
    assert sum(times.values()) == 95.5  # every second once: the "[self]" copies are not added again


def test_a_worker_that_dies_is_an_error_not_a_wait():
    # (the parent kept the child's end of the pipe open, so a crashed worker was waited for forever)
    with pytest.raises(RuntimeError, match=r"benchmark worker died \(exit code -11\)"):
        common.Worker("faulthandler:_sigsegv")

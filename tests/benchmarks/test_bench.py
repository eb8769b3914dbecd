"""The benchmark runner end to end, on one benchmark shrunk to a second's work.

Benchmarks never fail on a number; what must hold is that a run leaves results a reader can
re-check: the machine, the settings, and a median and spread for every case.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.paths import PROJECT

from bench import generation_speed
from bench.__main__ import main


@pytest.mark.process
def test_a_quick_run_records_machine_settings_median_and_spread(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(generation_speed, "NEW_TOKENS", 4)
    main(["--quick", "--results", str(tmp_path), "generation"])

    doc = json.loads((tmp_path / "generation.json").read_text())
    machine = doc["machine"]
    assert machine["cores"] >= 1 and machine["torch"] and machine["torch_threads"] >= 1
    assert {"cpu", "gpu", "load_avg"} <= machine.keys()
    assert doc["settings"]["new_tokens"] == 4 and doc["settings"]["repeats"] >= 2
    assert [(row["engine"], row["cache"]) for row in doc["rows"]] == [
        ("ours", False), ("ours", True), ("transformers", True)]
    for row in doc["rows"]:
        rate = row["tokens_per_s"]
        assert len(rate["values"]) == doc["settings"]["repeats"]
        assert min(rate["values"]) <= rate["median"] <= max(rate["values"])
        assert rate["spread"] >= 0
    summary = (tmp_path / "summary.md").read_text()
    assert "### generation" in summary and "Quick run, " in summary and " cores, torch " in summary
    assert "| engine | cache | threads | tokens/s |" in capsys.readouterr().out


@pytest.mark.process
def test_the_summary_keeps_the_tables_of_benchmarks_not_rerun(tmp_path, monkeypatch):
    monkeypatch.setattr(generation_speed, "NEW_TOKENS", 4)
    main(["--quick", "--results", str(tmp_path), "generation"])
    other = json.loads((tmp_path / "generation.json").read_text())
    other.update(name="earlier", columns=["case"], rows=[{"case": "kept from an earlier run"}])
    (tmp_path / "earlier.json").write_text(json.dumps(other))
    main(["--quick", "--results", str(tmp_path), "generation"])
    summary = (tmp_path / "summary.md").read_text()
    assert "### earlier" in summary and "kept from an earlier run" in summary
    assert summary.count("### generation") == 1


def test_unknown_names_are_refused_with_the_known_ones(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["no-such-benchmark"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "unknown benchmark(s) no-such-benchmark" in err and "train" in err


@pytest.mark.process
def test_time_to_quality_sends_corpus_flags_to_the_corpus_stage(tmp_path):
    from bench.time_to_quality import CHECKPOINTS, Case, run_case

    flags = ["--max_vocab", "300", "--max_iters", str(CHECKPOINTS), "--warmup_iters", "2",
             "--n_layer", "1", "--n_head", "2", "--n_embd", "32"]
    case = Case.parse("comedy", "gpt2", "default", flags)
    assert case.corpus_flags == {"max_vocab": "300"}
    assert case.train_flags == {
        "max_iters": str(CHECKPOINTS), "warmup_iters": "2", "n_layer": "1", "n_head": "2",
        "n_embd": "32",
    }
    row = run_case(case, tmp_path, "trial")
    meta = json.loads((tmp_path / "trial" / "data" / "meta.json").read_text())
    assert (meta["max_vocab"], meta["vocab_size"]) == (300, 300)
    assert [p["step"] for p in row["curve"]] == list(range(1, CHECKPOINTS + 1))
    assert row["corpus_flags"] == {"max_vocab": "300"} and row["steps"] == CHECKPOINTS


@pytest.mark.slow
def test_time_to_quality_times_our_default_to_the_quality_nanogpt_reaches(shared, tmp_path):
    """The quick run: nanoGPT itself (20 iterations) and our default recipe (3 s) on the comedy,
    nanoGPT's checkpoint scored by our evaluator."""
    began = time.monotonic()
    main(["--quick", "--results", str(tmp_path), "time_to_quality"])
    took = time.monotonic() - began

    doc = json.loads((tmp_path / "time_to_quality.json").read_text())
    nanogpt, ours = doc["rows"]
    assert (nanogpt["trainer"], nanogpt["recipe"], nanogpt["tokenizer"]) == (
        "nanogpt", "reference", "char")
    assert (ours["trainer"], ours["recipe"]) == ("ours", "default")
    flags = nanogpt["train_flags"]
    assert (flags["max_iters"], flags["lr_decay_iters"], flags["eval_interval"]) == (20, 20, 20)
    assert (flags["device"], flags["compile"], flags["dtype"]) == ("cpu", False, "float32")
    # Its training time, part of the benchmark's own (no wall-clock bound: the machine may be busy).
    assert nanogpt["steps"] == 20 and 0 < nanogpt["train s"] < took
    # Its checkpoint is a trained model, scored like nanoGPT's own estimate of it (its 20
    # random batches, ours evenly spread windows), and below chance (~6 bits per character).
    assert nanogpt["best bpb"] == pytest.approx(nanogpt["own_val_bpb"], abs=0.1)
    assert nanogpt["best bpb"] < 5.8
    # The target is what nanoGPT reached, in its own time: 1.00x by definition.
    assert nanogpt["target bpb"] == ours["target bpb"] == nanogpt["best bpb"]
    assert nanogpt["s to target"] == nanogpt["train s"]
    assert nanogpt["vs nanoGPT's time"] == "1.00x"
    # Ours reaches it at its first checkpoint at the latest: 20 iterations leave nanoGPT near
    # chance, and chance per byte is lower for BPE tokens than for characters.
    first = ours["curve"][0]
    assert first["val_bpb"] <= ours["target bpb"] and ours["s to target"] == first["train_s"]
    assert ours["time_ratio_to_nanogpt"] == pytest.approx(first["train_s"] / nanogpt["train s"])


def test_nanogpt_is_timed_by_its_iteration_lines_without_its_evaluations():
    from bench.time_to_quality import nanogpt_train_s

    # Iteration 0's line waits for the evaluation before it (1.0 s late); iterations 1-3 take
    # 0.5 s each; the line of iteration 4 (past the checkpoint) waits for the last evaluation.
    arrivals = [(0, 3.0), (1, 3.5), (2, 4.0), (3, 4.5), (4, 9.0)]
    assert nanogpt_train_s(arrivals, 4) == pytest.approx(2.0)
    with pytest.raises(RuntimeError, match="iteration 0 or 5 of 6"):  # it stopped short
        nanogpt_train_s(arrivals, 6)


def test_rates_are_timed_from_the_first_line_after_the_warm_up_to_the_last_line():
    from bench.vs_nanogpt import Case, Shape, row_of

    shape = Shape(1, 1, 8, 4, 100, "char", "cpu", steps=31, warmup=10)
    # Every 10 steps and the first: nanoGPT logs iterations 0, 10, 20, 30 (1, 11, 21 and 31
    # steps done), we steps 1, 10, 20, 30. Timed: nanoGPT 11 -> 31, ours 10 -> 30.
    times = [2.0, 3.0, 4.0, 5.0]
    for trainer, numbers in (("nanogpt", (0, 10, 20, 30)), ("ours", (1, 10, 20, 30))):
        runs = [{"arrivals": [(n, t + extra) for n, t in zip(numbers, times, strict=True)],
                 "rss_mib": 300.0 + extra} for extra in (0.0, 1.0)]
        row = row_of(shape, Case(trainer, trainer, 4), runs, flops=0.0, peak=None)
        assert row["steps_timed"] == 20
        assert row["tokens_per_s"]["values"] == pytest.approx([20 * 100 / 2.0] * 2)
        assert row["first_step_s"]["values"] == [2.0, 3.0] and row["rss_mib"] == 301.0


@pytest.mark.slow
def test_vs_nanogpt_runs_the_peer_and_ours_side_by_side(shared, tmp_path, monkeypatch):
    from bench import vs_nanogpt

    tiny = vs_nanogpt.Shape(2, 2, 32, 32, 256, "char", "cpu", steps=20, warmup=5)
    monkeypatch.setattr(vs_nanogpt, "shape_for", lambda cuda, quick: tiny)
    main(["--quick", "--results", str(tmp_path), "vs_nanogpt"])

    doc = json.loads((tmp_path / "vs_nanogpt.json").read_text())
    assert doc["settings"]["device_name"] == "cpu" and doc["settings"]["shape"]["steps"] == 20
    rows = {row["case"]: row for row in doc["rows"]}
    assert sorted(rows) == ["nanoGPT", "ours, GPT-2 choices", "ours, default model"]
    for row in rows.values():  # logged at 1, 10 and (ours) 20: timed over 10 steps each
        assert row["steps_timed"] == 10 and row["tokens_per_s"]["median"] > 0
        assert 0 < row["first_step_s"]["median"] < 120 and row["rss_mib"] > 50
    assert rows["nanoGPT"]["ratio_to_best_nanogpt"] == 1.0
    ours = rows["ours, default model"]
    assert ours["ratio_to_best_nanogpt"] == pytest.approx(
        ours["tokens_per_s"]["median"] / rows["nanoGPT"]["tokens_per_s"]["median"])


@pytest.mark.slow
def test_precision_trains_one_model_in_float32_and_bfloat16_whole_and_chunked(tmp_path,
                                                                              monkeypatch):
    from bench import precision, vs_nanogpt

    tiny = vs_nanogpt.Shape(2, 2, 32, 32, 256, "char", "cpu", steps=20, warmup=5)
    monkeypatch.setattr(vs_nanogpt, "shape_for", lambda cuda, quick: tiny)
    main(["--quick", "--results", str(tmp_path), "precision"])

    doc = json.loads((tmp_path / "precision.json").read_text())
    rows = {row["way"]: row for row in doc["rows"]}
    assert list(rows) == list(precision.WAYS) and doc["settings"]["device_name"] == "cpu"
    fp32 = rows["float32"]["losses"]
    whole, chunked = (rows[f"bfloat16, {w}"]["losses"] for w in ("whole logits", "chunked loss"))
    assert len(fp32) == len(whole) == len(chunked) == precision.STEPS
    assert fp32 != whole and whole != chunked  # all ran, each its own way
    assert rows["float32"]["largest_gap"] == 0
    gaps = [abs(b - a) / a for a, b in zip(fp32, chunked, strict=True)]
    assert rows["bfloat16, chunked loss"]["largest_gap"] == max(gaps)
    # the chunked loss learns as the whole logits do (the bar: within 1%)
    assert 0 < rows["bfloat16, chunked loss"]["largest_gap_to_whole"] < 0.01


@pytest.mark.process
def test_step_memory_finds_the_chunked_loss_holds_a_fraction_of_the_logits(shared, tmp_path,
                                                                           monkeypatch):
    """Eager, float32, on the CPU (the compiled mode left out: a minute of compiling), at half
    the benchmark's positions in four chunks as there (the logits still nearly all of the
    memory): nanoGPT holds about four float32 (B, T, V) tensors at its peak, our whole logits one
    fewer (dropped as the forward returns, where nanoGPT keeps them through the backward), the
    chunked loss a fraction of one."""
    from bench import step_memory

    eager = step_memory.shapes(cuda=False, quick=True)[0]
    half = {**eager, **{k: eager[k] // 2 for k in ("micro_batch", "chunk_rows")}}
    monkeypatch.setattr(step_memory, "shapes", lambda cuda, quick: [half])
    main(["--quick", "--results", str(tmp_path), "step_memory"])
    rows = {row["case"]: row for row in json.loads((tmp_path / "step_memory.json").read_text())
            ["rows"]}
    held = {case: row["peak_bytes"] / row["logits_bytes"] for case, row in rows.items()}
    assert held["nanoGPT"] > 3.5
    assert 2.5 < held["ours, whole logits"] < held["nanoGPT"] - 0.5
    assert held["ours, chunked loss"] < 0.75


def test_on_cuda_both_trainers_get_gpt2_124m_at_the_same_tokens_per_step(tmp_path):
    """The GPU comparison, checked without a GPU: the command lines each case would run."""
    from bench import vs_nanogpt
    from gpt.config.cli import parse_config
    from gpt.config.configs import TrainConfig

    shape = vs_nanogpt.shape_for(cuda=True, quick=False)
    splits = set()
    for case in vs_nanogpt.cases(shape, quick=False):
        if case.trainer == "nanogpt":
            argv = vs_nanogpt.nanogpt_command(shape, case)
            flags = dict(a[2:].split("=", 1) for a in argv[2:])
            tokens = (int(flags["batch_size"]) * int(flags["gradient_accumulation_steps"])
                      * int(flags["block_size"]))
            shape_of = (flags["n_layer"], flags["n_head"], flags["n_embd"])
            assert (flags["device"], flags["dtype"], flags["compile"]) == ("cuda", "bfloat16",
                                                                           "True")
        else:
            argv = vs_nanogpt.ours_command(shape, case, tmp_path, "r")
            cfg = parse_config(TrainConfig, argv[4:], "train-gpt", "")  # validated as the CLI does
            tokens = cfg.batch_size * cfg.block_size
            assert cfg.batch_size // cfg.grad_accum == case.micro_batch
            shape_of = (str(cfg.n_layer), str(cfg.n_head), str(cfg.n_embd))
            assert (cfg.device, cfg.compile) == ("cuda", True)
        assert tokens == 65536 and shape_of == ("12", "12", "768")
        splits.add((case.trainer, case.micro_batch))
    assert splits == {(t, m) for t in ("nanogpt", "ours") for m in (16, 64)}


def test_the_gpu_session_s_vs_nanogpt_takes_one_split_and_the_winning_flags(tmp_path,
                                                                           monkeypatch):
    from bench import vs_nanogpt
    from gpt.config.cli import parse_config
    from gpt.config.configs import TrainConfig

    monkeypatch.setenv("BENCH_SPLITS", "64")
    monkeypatch.setenv("BENCH_OURS_FLAGS", '{"fused_loss": true}')
    shape = vs_nanogpt.shape_for(cuda=True, quick=False)
    found = vs_nanogpt.cases(shape, quick=False)
    assert [c.label for c in found] == ["nanoGPT 64 x 1", "ours default 64 x 1",
                                        "ours GPT-2 choices 64 x 1"]
    for case in found[1:]:
        argv = vs_nanogpt.ours_command(shape, case, tmp_path, "r")
        assert parse_config(TrainConfig, argv[4:], "train-gpt", "").fused_loss is True
    monkeypatch.setenv("BENCH_OURS_FLAGS", "[1]")
    with pytest.raises(ValueError, match="BENCH_OURS_FLAGS"):
        vs_nanogpt.ours_flags()


def test_gpu_variants_compares_with_the_default_and_picks_flags_that_win(tmp_path):
    from bench import gpu_variants

    rows = [{"flags": {}, "tokens_per_s": 100.0, "losses": [10.0, 8.0]},
            {"flags": {"fused_loss": True}, "tokens_per_s": 103.0, "losses": [10.0, 8.08]},
            {"flags": {}, "tokens_per_s": 150.0, "losses": [10.0, 8.0]},  # inductor: no flag
            {"flags": {"other": 1}, "tokens_per_s": 100.5, "losses": [10.1, 8.0]}]
    gpu_variants.compare(rows)
    assert [r["vs default"] for r in rows] == ["1.000x", "1.030x", "1.500x", "1.005x"]
    assert rows[1]["largest_loss_gap"] == pytest.approx(0.01)
    assert rows[3]["largest loss gap to the default"] == "1.000%"
    (tmp_path / "r.json").write_text(json.dumps({"rows": rows}))
    assert gpu_variants.winners(tmp_path / "r.json") == {"fused_loss": True}


@pytest.mark.process
def test_gpu_variants_writes_each_variant_as_it_ends(tmp_path, monkeypatch):
    """A call that ends inside a variant (its compile outlasting the step's limit) keeps the
    variants before it, compared with the default."""
    from bench import gpu_variants

    monkeypatch.setattr(gpu_variants, "interpret_off_cuda", lambda cuda: True)  # no env set
    monkeypatch.setattr(gpu_variants, "kernel_check", lambda cuda: {"loss_gap": 0.0})

    def measure(cfg, variant, cuda):
        if variant.flags:
            raise RuntimeError("cut short")
        return {"variant": variant.label, "flags": {}, "tokens_per_s": 10.0, "losses": [1.0]}

    monkeypatch.setattr(gpu_variants, "measure", measure)
    with pytest.raises(RuntimeError, match="cut short"):
        main(["--results", str(tmp_path), "gpu_variants"])
    doc = json.loads((tmp_path / "gpu_variants.json").read_text())
    assert [row["variant"] for row in doc["rows"]] == ["default"]
    assert doc["rows"][0]["vs default"] == "1.000x" and doc["settings"]["kernel_check"]


@pytest.mark.process
def test_the_corpus_benchmark_measures_speed_and_peak_memory_next_to_raw_tiktoken(
    tmp_path, monkeypatch
):
    from bench import corpus_speed

    monkeypatch.setattr(corpus_speed, "SIZES", {"5 MB": 300_000})  # the embedded corpus, 3 times
    monkeypatch.setattr(corpus_speed, "PLAYS", tmp_path / "absent.txt")
    result = corpus_speed.run(quick=True)
    cases = [(r["tokenizer"], r["compact"]) for r in result.rows]
    assert cases == [("gpt2", True), ("char", False)]
    for row in result.rows:
        assert row["bytes"] > 250_000 and row["MB/s"] > 0 and row["raw tiktoken MB/s"] > 0
        assert 10 < row["peak RSS MB"] < 600 and row["vs raw"].endswith("x")
        assert row["raw_peak_rss_mb"] > 10


@pytest.mark.process
def test_a_childs_peak_memory_is_its_own_not_that_of_the_process_it_was_spawned_from():
    from bench.corpus_speed import child

    ballast = b"\x01" * (700 << 20)  # a parent as large as a long test session
    _, rss, out = child([sys.executable, "-c", "print('ok')"])
    assert out == "ok\n" and 1 < rss < 100, rss
    del ballast


def test_stop_checkpoint_times_the_checkpoint_a_sigterm_writes(monkeypatch):
    from bench import stop_checkpoint
    from gpt.config.configs import TrainConfig
    from gpt.training.recipe import finish

    model = finish(TrainConfig(n_layer=1, n_embd=32, n_head=2), 64, 1000).model
    monkeypatch.setattr(stop_checkpoint, "MODELS", {"tiny": model})
    (row,) = stop_checkpoint.run(quick=True).rows
    # Weights and AdamW's two moments, float32: at least three copies of the parameters.
    from gpt.models.model import GPT

    params = sum(p.numel() for p in GPT(model).parameters())
    assert row["bytes"] >= 3 * 4 * params
    assert row["save_s"]["median"] > 0


GPU_SESSION = PROJECT / "bench" / "gpu_session.sh"


@pytest.mark.process
def test_the_gpu_session_stops_at_once_without_a_gpu():
    """On a machine without CUDA it says so in one line and writes nothing."""
    out = subprocess.run(["bash", str(GPU_SESSION)], capture_output=True, text=True,
                         env=dict(os.environ, PYTHON=sys.executable, OUT=""))
    assert out.returncode == 1
    assert out.stderr.strip() == "gpu_session: no CUDA device here; run it on a GPU machine"
    assert not (GPU_SESSION.parent / "results" / "gpu").exists()


def _gpu_session(tmp_path, *args: str, budget: int = 540, sleep: int = 0):
    """The session with a `python` that answers as one with a GPU and, for a benchmark,
    sleeps `sleep` seconds; what it was called with (and BENCH_SPLITS, BENCH_OURS_FLAGS), one
    call a line."""
    stub = tmp_path / "python"
    stub.write_text(f"""#!/usr/bin/env bash
echo "$* | ${{BENCH_SPLITS:-}} | ${{BENCH_OURS_FLAGS:-}}" >> {tmp_path}/calls
case "$1 $2" in
    "-m bench.gpu_variants") echo '{{"fused_loss": true}}' ;;
    "-m bench") exec sleep {sleep} ;;
esac
""")
    stub.chmod(0o755)
    out = subprocess.run(["bash", str(GPU_SESSION), *args], capture_output=True, text=True,
                         env=dict(os.environ, PYTHON=str(stub), OUT=str(tmp_path),
                                  GPU_SESSION_BUDGET_S=str(budget)))
    calls = (tmp_path / "calls").read_text().splitlines()
    return out, [call for call in calls if call.startswith("-m ")]  # not the CUDA check's -c


@pytest.mark.process
def test_the_gpu_session_runs_the_variants_then_vs_nanogpt_with_their_winners(tmp_path):
    from bench.__main__ import BENCHMARKS

    out, calls = _gpu_session(tmp_path)
    assert out.returncode == 0, out.stderr
    results = tmp_path / "gpu-results"
    assert calls == [
        f"-m bench --results {results} finetune_memory |  | ",
        f"-m bench --results {results} gpu_variants |  | ",
        f"-m bench.gpu_variants winners {results}/gpu_variants.json |  | ",
        f'-m bench --results {results} vs_nanogpt | 64 | {{"fused_loss": true}}',
        f"-m bench --results {results} precision --quick |  | ",
    ]
    assert {"finetune_memory", "gpu_variants", "vs_nanogpt", "precision"} <= set(BENCHMARKS)
    assert "gpu_session: done in" in (results / "session.log").read_text()


@pytest.mark.process
def test_the_gpu_session_leaves_out_what_its_budget_cannot_hold(tmp_path):
    out, calls = _gpu_session(tmp_path, budget=130)
    assert out.returncode == 0, out.stderr
    assert [c.split(" | ")[0].split()[-1] for c in calls if "-m bench " in c] == [
        "finetune_memory", "gpu_variants"]
    assert re.search(r"gpu_session: vs_nanogpt left out: it takes about 170 s, 1[23]\d s of the "
                     r"budget are left; run it in a call of its own: bash bench/gpu_session.sh "
                     r"vs_nanogpt\n", out.stdout)
    assert "gpu_session: precision --quick left out" in out.stdout


@pytest.mark.process
def test_the_gpu_session_stops_a_benchmark_at_the_end_of_its_budget(tmp_path):
    """Named, a benchmark runs whole, within what is left of the budget; past it, it is stopped
    and the session fails, saying which."""
    out, calls = _gpu_session(tmp_path, "precision", budget=1, sleep=30)
    assert out.returncode == 1
    assert len(calls) == 1 and calls[0].startswith("-m bench --results ")
    assert "gpu_session: precision stopped at its limit of 1 s" in out.stdout
    assert out.stdout.rstrip().endswith("failed: precision")


@pytest.mark.process
def test_the_gpu_session_prepares_the_peer_and_the_plays_to_carry(tmp_path):
    repo, shared = tmp_path / "repo", tmp_path / "shared"
    (repo / "bench").mkdir(parents=True)
    shutil.copy(GPU_SESSION, repo / "bench")
    (shared / "peers" / "nanogpt").mkdir(parents=True)
    (shared / "peers" / "nanogpt" / "train.py").write_text("# nanoGPT")
    (shared / "data").mkdir()
    (shared / "data" / "shakespeare_plays.txt").write_text("ACT I")
    out = subprocess.run(["bash", "bench/gpu_session.sh", "prepare"], cwd=repo,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (repo / ".gpu-shared/peers/nanogpt/train.py").read_text() == "# nanoGPT"
    assert (repo / ".gpu-shared/data/shakespeare_plays.txt").read_text() == "ACT I"


def test_finetune_memory_measures_nothing_without_a_gpu_and_keeps_a_failed_case_as_a_row(
        tmp_path, monkeypatch, capsys):
    """The GPU script on a CPU says so and writes no row; a case whose process fails (here: no
    CUDA) is a row naming the error, so one out-of-memory size costs the others nothing."""
    from bench import finetune_memory

    assert finetune_memory.run(quick=True, results=tmp_path).rows == []
    assert "no CUDA device here" in capsys.readouterr().out
    assert not (tmp_path / "finetune_memory.jsonl").exists()
    failed = subprocess.CompletedProcess([], 1, "", "Traceback ...\ntorch.OutOfMemoryError: "
                                         "CUDA out of memory.\n")  # fmt: skip
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: failed)
    assert finetune_memory.case("gpt2-xl", "full") == {
        "error": "torch.OutOfMemoryError: CUDA out of memory."}


def test_finetune_times_the_tuned_run_to_its_first_evaluation_at_scratchs_final_value():
    from bench.finetune import compared, met, reached

    scratch = [(25, 10.0, 3.0), (50, 20.0, 2.5), (100, 40.0, 2.0)]  # (iteration, s, bits/byte)
    tuned = [(25, 11.0, 2.2), (50, 22.0, 1.9), (75, 33.0, 2.0), (100, 44.0, 1.95)]
    assert reached(tuned, 2.0) == (50, 22.0)  # the first at or below, not the best
    assert compared(tuned, scratch) == (100, 44.0, 1.95, {
        "reaches_scratch_at": "step 50, 22.0 s", "time_ratio": 0.55, "iteration_ratio": 0.5})
    assert compared(scratch, scratch)[3]["time_ratio"] == 1.0
    assert compared([(100, 40.0, 2.1)], scratch)[3] == {
        "reaches_scratch_at": "never", "time_ratio": "-", "iteration_ratio": "-"}
    assert not met(tuned, scratch)  # 0.55 of the time
    assert met([(25, 10.0, 1.99), (100, 44.0, 1.9)], scratch)  # 0.25 of the time, ends lower
    assert not met([(25, 10.0, 1.99), (100, 44.0, 2.01)], scratch)  # ends higher
    assert not met([(25, 10.1, 1.99), (100, 44.0, 1.9)], scratch)  # over 0.25


def test_finetune_pretrains_once_and_keeps_no_half_made_model(tmp_path, monkeypatch):
    from bench import finetune

    plays = tmp_path / "plays.txt"
    plays.write_text("To be, or not to be.")
    monkeypatch.setattr(finetune, "CACHE", tmp_path / "cache")
    calls = []

    def fake_gpt(stage, *argv):
        calls.append(stage)
        if stage == "train-gpt":
            root = argv[argv.index("--root") + 1]
            (Path(root) / "plays" / "model").mkdir(parents=True)

    monkeypatch.setattr(finetune, "gpt", fake_gpt)
    root, cached = finetune.pretrained(plays, 7)
    assert not cached and (root / "plays" / "model").is_dir() and root.name.endswith("-7it")
    assert finetune.pretrained(plays, 7) == (root, True) and len(calls) == 2  # not again

    def failing_gpt(stage, *argv):
        raise RuntimeError("killed")

    monkeypatch.setattr(finetune, "gpt", failing_gpt)
    with pytest.raises(RuntimeError):
        finetune.pretrained(plays, 8)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [root.name]


def test_activation_memory_measures_each_gpt2_size_and_the_estimate_follows_it():
    """Instant (the meta device): checkpointing keeps under a fifth of what the plain forward
    saves for backward, less the larger the model; train-gpt's estimate within 40% of both.
    (`run` itself: the harness's report of the machine starts processes.)"""
    from bench import activation_memory

    rows = activation_memory.run(quick=True).rows
    assert [(r["size"], r["mode"]) for r in rows] == [
        ("gpt2", "plain"), ("gpt2", "checkpointed"),
        ("gpt2-medium", "plain"), ("gpt2-medium", "checkpointed")]  # fmt: skip
    pairs = zip(rows[::2], rows[1::2], strict=True)
    shares = [checkpointed["saved_bytes"] / plain["saved_bytes"] for plain, checkpointed in pairs]
    assert shares[0] < 0.2 and shares[1] < shares[0]
    for row in rows:
        assert 0.6 < row["estimate_bytes"] / row["saved_bytes"] < 1.6, row


@pytest.mark.process
@pytest.mark.slow
def test_the_chat_loss_benchmark_compares_the_two_losses_on_the_same_rows(tmp_path):
    main(["--quick", "--results", str(tmp_path), "chat_loss"])
    rows = json.loads((tmp_path / "chat_loss.json").read_text())["rows"]
    assert [row["loss_on"] for row in rows] == ["assistant tokens", "every token"]
    assistant, every = rows
    # every token but the padding counts: more than the assistant's, the same budget
    assert 0 < assistant["counted_train_tokens"] < every["counted_train_tokens"]
    assert assistant["iterations"] == every["iterations"] == 10
    assert all(row["val_loss"] > 0 and row["val_bpb"] > 0 for row in rows)

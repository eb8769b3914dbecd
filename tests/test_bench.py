"""The benchmark runner end to end, on one benchmark shrunk to a second's work.

Benchmarks never fail on a number; what must hold is that a run leaves results a reader can
re-check: the machine, the settings, and a median and spread for every case.
"""

from __future__ import annotations

import json

import pytest

from bench import generation_speed
from bench.__main__ import main


def test_a_quick_run_records_machine_settings_median_and_spread(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(generation_speed, "NEW_TOKENS", 4)
    main(["--quick", "--results", str(tmp_path), "generation"])

    doc = json.loads((tmp_path / "generation.json").read_text())
    machine = doc["machine"]
    assert machine["cores"] >= 1 and machine["torch"] and machine["torch_threads"] >= 1
    assert {"cpu", "gpu", "load_avg"} <= machine.keys()
    assert doc["settings"]["new_tokens"] == 4 and doc["settings"]["repeats"] >= 2
    assert [row["cache"] for row in doc["rows"]] == [False, True]
    for row in doc["rows"]:
        rate = row["tokens_per_s"]
        assert len(rate["values"]) == doc["settings"]["repeats"]
        assert min(rate["values"]) <= rate["median"] <= max(rate["values"])
        assert rate["spread"] >= 0
    summary = (tmp_path / "summary.md").read_text()
    assert "### generation" in summary and "Quick run, " in summary and " cores, torch " in summary
    assert "| cache | threads | tokens/s |" in capsys.readouterr().out


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

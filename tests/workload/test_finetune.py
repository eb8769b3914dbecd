"""Fine-tuning (--init_from, issue 46) through the stages: load-corpus tokenizes as GPT-2 does,
train-gpt starts from the pretrained weights (read at iteration 0 only), records where it
started, resumes bit-exactly after a SIGKILL, refuses data of another vocabulary before any
weights load; the export is a GPT2LMHeadModel transformers opens with our greedy reply.

"gpt2" is the Hub's openai-community/gpt2, here a random GPT-2 written by transformers into a
Hub cache laid out as huggingface_hub lays one out, read with HF_HUB_OFFLINE=1: nothing
downloads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from support.gpt2 import gpt2_folder, hub_cache
from support.runs import (
    ONE_THREAD,
    TEXT,
    TINY_FINETUNE,
    as_flags,
    assert_same_weights,
    in_process,
    records,
    write_data,
)

from gpt.config.configs import SamplingConfig
from gpt.fetch.model_source import cache_dir
from gpt.generation.sampling import generate
from gpt.models.export import load_export
from gpt.rundir.layout import DataMeta, RunDir
from gpt.stages import TRAIN_GPT
from gpt.tokenizer.kinds import load_tokenizer
from gpt.tokenizer.ranks import gpt2_encoding

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def gpt2_root(tmp_path_factory) -> Path:
    """A run root whose Hub cache holds "gpt2" (openai-community/gpt2) at COMMIT, and a folder
    `gpt2/` of the same model (for --init_from as a folder)."""
    root = tmp_path_factory.mktemp("root")
    gpt2_folder(root / "gpt2-folder")
    hub_cache(cache_dir(root), "openai-community/gpt2", root / "gpt2-folder", COMMIT)
    return root


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def corpus(root: Path, run: str, *flags: str) -> RunDir:
    assert in_process("load-corpus", "--root", str(root), "--run", run, "--block_size", "16",
                      *flags) == 0  # fmt: skip
    return RunDir.of(root, run)


def finetune(root: Path, run: str, *flags: str) -> int:
    return in_process("train-gpt", "--root", str(root), "--run", run, "--init_from", "gpt2",
                      *as_flags(TINY_FINETUNE), *flags)  # fmt: skip


@pytest.mark.process
def test_gpt2_from_the_hub_cache_fine_tunes_and_exports_as_gpt2(gpt2_root, offline, tmp_path,
                                                                capfd):  # fmt: skip
    """Through the train-gpt component (its plain function, the local backend), whose Metrics
    artifact records what the run started from beside the numbers."""
    from kfp.dsl import HTML, Metrics, Model

    from components.train_gpt import train_gpt

    run = corpus(gpt2_root, "a", "--init_from", "gpt2")
    meta = DataMeta.read(run.meta_json)
    assert meta.init_from == "hf://openai-community/gpt2" and meta.max_vocab == 0
    # GPT-2's tokens as GPT-2 splits the text, renumbered: no rare token spelt in bytes
    tok = load_tokenizer(run.tokenizer_json)
    text = run.text_txt.read_text()
    cut = int(len(text) * 0.9)
    ids = np.fromfile(run.train_bin, dtype=np.uint16)
    assert np.array(tok.kept)[ids].tolist() == gpt2_encoding().encode_ordinary(text[:cut])

    metrics = Metrics(uri=str(tmp_path / "metrics"))
    flags = {k: v for k, v in TINY_FINETUNE.items() if k != "device"}  # not a step parameter
    model = Model(uri=str(tmp_path / "model"))
    train_gpt.python_func(run="a", root=str(gpt2_root), backend="local", init_from="gpt2",
                          max_iters=4, metrics=metrics, report=HTML(uri=str(tmp_path / "r.html")),
                          model=model, **flags)  # fmt: skip
    assert model.metadata["init_from"] == "hf://openai-community/gpt2"
    assert model.metadata["model_uri"] == run.model_dir.as_uri()
    out = capfd.readouterr().out
    assert f"init_from: hf://openai-community/gpt2 at {COMMIT}" in out
    assert "2 layers x 2 heads x 32 wide, context 16" in out  # the checkpoint's, cropped
    record = json.loads(run.init_from_json.read_text())
    assert record["init_from"] == "hf://openai-community/gpt2" and record["revision"] == COMMIT
    assert len(record["weights_sha256"]) == 64
    assert metrics.metadata == {
        **metrics.metadata, "steps": 4.0, "init_from": "hf://openai-community/gpt2",
        "init_from_revision": COMMIT, "init_from_weights_sha256": record["weights_sha256"],
    }  # fmt: skip
    assert f"fine-tuned from | hf://openai-community/gpt2 at revision {COMMIT}" in \
        run.report_md.read_text()

    config = json.loads((run.model_dir / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"]
    assert config["activation_function"] == "gelu_new" and config["n_positions"] == 16
    assert config["finetuned_from"].startswith(f"hf://openai-community/gpt2 at revision {COMMIT}")
    import transformers

    theirs = transformers.AutoModelForCausalLM.from_pretrained(run.model_dir).eval()
    ours, tokenizer = load_export(run.model_dir)
    prompt = tokenizer.encode("ANTIPHOLUS. What")
    n = 16 - len(prompt)
    mine = list(generate(ours, prompt, SamplingConfig(temperature=0, max_new_tokens=n),
                         stop_ids={tokenizer.eot_id}, vocab_size=tokenizer.vocab_size))  # fmt: skip
    with torch.no_grad():
        got = theirs.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    reply = got[0, len(prompt):].tolist()
    reply = reply[: reply.index(tokenizer.eot_id)] if tokenizer.eot_id in reply else reply
    assert reply == mine


@pytest.mark.slow
def test_the_first_iteration_starts_from_the_pretrained_weights(gpt2_root, offline):
    """With a learning rate too small to move a float32 weight, the export is the pretrained
    model itself, its embedding rows those of the corpus's tokens."""
    run = corpus(gpt2_root, "a", "--init_from", "gpt2")
    shutil.copytree(run.data_dir, gpt2_root / "z" / "data")
    assert finetune(gpt2_root, "z", "--max_iters", "1", "--learning_rate", "1e-30",
                    "--weight_decay", "0") == 0  # fmt: skip
    exported = load_file(gpt2_root / "z" / "model" / "model.safetensors")
    pre = load_file(gpt2_root / "gpt2-folder" / "model.safetensors")
    kept = load_tokenizer(run.tokenizer_json).kept
    assert torch.equal(exported["transformer.wte.weight"], pre["transformer.wte.weight"][kept])
    assert torch.equal(exported["transformer.wpe.weight"], pre["transformer.wpe.weight"][:16])
    assert torch.equal(exported["transformer.h.1.mlp.c_fc.bias"],
                       pre["transformer.h.1.mlp.c_fc.bias"])


def test_data_for_another_vocabulary_is_refused_before_any_weights_load(gpt2_root, tmp_path,
                                                                         capsys):
    folder = tmp_path / "broken"
    shutil.copytree(gpt2_root / "gpt2-folder", folder)
    (folder / "model.safetensors").write_bytes(b"not weights")  # reading it would fail
    write_data(tmp_path, "chars")  # a character vocabulary
    code = in_process("train-gpt", "--root", str(tmp_path), "--run", "chars", "--init_from",
                      str(folder), *as_flags(TINY_FINETUNE))  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "the data was not tokenized for a pretrained model" in err[0]
    assert not (tmp_path / "chars" / "ckpt").exists()


@pytest.fixture(scope="module")
def earlier(gpt2_root) -> RunDir:
    """An earlier run fine-tuned from the GPT-2 folder: its model/ has a compacted vocabulary."""
    folder = str(gpt2_root / "gpt2-folder")
    run = corpus(gpt2_root, "earlier", "--init_from", folder)
    assert in_process("train-gpt", "--root", str(gpt2_root), "--run", "earlier", "--init_from",
                      folder, *as_flags(TINY_FINETUNE), "--max_iters", "2") == 0  # fmt: skip
    return run


@pytest.mark.slow
def test_a_corpus_tokenized_for_another_compaction_is_refused(earlier, tmp_path, capsys):
    """An earlier run's model/ (a compacted vocabulary) as --init_from, on data another text
    compacted GPT-2 to: one line naming both vocabularies."""
    (tmp_path / "other.txt").write_text(TEXT)
    corpus(tmp_path, "b", "--init_from", "gpt2", "--source", str(tmp_path / "other.txt"))
    capsys.readouterr()
    code = in_process("train-gpt", "--root", str(tmp_path), "--run", "b", "--init_from",
                      str(earlier.model_dir), *as_flags(TINY_FINETUNE))  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "the data's tokenizer (gpt2 compacted to" in err[0] and "is not --init_from's" in err[0]


def chat_corpus(root: Path, run: str, start: str) -> None:
    """Short conversations (--chat true) tokenized for `start`: a row is 17 tokens."""
    chats = root / f"{run}.jsonl"
    chats.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": "Where?"},
        {"role": "assistant", "content": f"{w}."}]}) + "\n"
        for w in ("master", "sir", "wife", "slave", "meat", "feast", "husband", "merchant")))
    corpus(root, run, "--init_from", start, "--source", str(chats), "--chat", "true")


def chat_tune(root: Path, run: str, start: str) -> torch.Tensor:
    """Conversations fine-tuned one iteration from `start` at a learning rate too small to move
    a float32 weight: the export's embedding is where the run started."""
    chat_corpus(root, run, start)
    assert in_process("train-gpt", "--root", str(root), "--run", run, "--init_from", start,
                      *as_flags(TINY_FINETUNE), "--max_iters", "1", "--learning_rate", "1e-30",
                      "--weight_decay", "0", "--batch_size", "2") == 0  # fmt: skip
    return load_file(root / run / "model" / "model.safetensors")["transformer.wte.weight"]


@pytest.mark.slow
def test_chat_data_fine_tunes_gpt2_with_new_rows_for_the_markers(gpt2_root, offline):
    """GPT-2 has no chat markers: they become two rows at the mean of its embedding, after the
    rows of the conversations' tokens."""
    exported = chat_tune(gpt2_root, "chat", "gpt2")  # the root whose Hub cache holds "gpt2"
    table = load_file(gpt2_root / "gpt2-folder" / "model.safetensors")["transformer.wte.weight"]
    tok = load_tokenizer(RunDir.of(gpt2_root, "chat").tokenizer_json)
    assert tok.chat and exported.shape[0] == len(tok.kept) + 2
    assert torch.equal(exported[:-2], table[tok.kept])
    assert torch.allclose(exported[-2:], table.mean(0).expand(2, -1), atol=1e-6, rtol=0)


def test_chat_data_fine_tunes_a_text_model_then_its_chat_model(earlier, tmp_path):
    """On an earlier text run's model/: its vocabulary with the two chat markers after it,
    their rows at the mean of its embedding; on that chat run's model/, its own rows."""
    text_rows = load_file(earlier.model_dir / "model.safetensors")["transformer.wte.weight"]
    first = chat_tune(tmp_path, "chat", str(earlier.model_dir))
    tok = load_tokenizer(RunDir.of(tmp_path, "chat").tokenizer_json)
    assert tok.chat and tok.kept == load_tokenizer(earlier.tokenizer_json).kept
    assert torch.equal(first[:-2], text_rows)
    assert torch.allclose(first[-2:], text_rows.mean(0).expand(2, -1), atol=1e-6, rtol=0)
    again = chat_tune(tmp_path, "again", str(RunDir.of(tmp_path, "chat").model_dir))
    assert torch.equal(again, first)


def test_lora_on_chat_data_needs_a_start_that_has_the_markers(earlier, tmp_path, capsys):
    """LoRA freezes the embedding: new marker rows would stay where they start, both at the
    mean (a turn's start and end alike to the model, in and out), so it is refused in one line
    naming the way; from a chat run, whose markers are trained rows, it runs."""
    chat_corpus(tmp_path, "lora", str(earlier.model_dir))
    flags = [*as_flags(TINY_FINETUNE), "--max_iters", "1", "--lora_rank", "2"]
    assert in_process("train-gpt", "--root", str(tmp_path), "--run", "lora", "--init_from",
                      str(earlier.model_dir), *flags) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        f"--lora_rank 2: --init_from {earlier.model_dir} has no chat markers: they would be new "
        "rows of the embedding, which LoRA keeps frozen, both at its mean (a turn's start and "
        "end alike to the model); fine-tune fully first (--lora_rank 0; "
        "--activation_checkpointing true or --shard true save memory), then LoRA from that run")
    chat_tune(tmp_path, "chat", str(earlier.model_dir))
    chat_corpus(tmp_path, "again", str(RunDir.of(tmp_path, "chat").model_dir))
    assert in_process("train-gpt", "--root", str(tmp_path), "--run", "again", "--init_from",
                      str(RunDir.of(tmp_path, "chat").model_dir), *flags) == 0  # fmt: skip


def test_fine_tuning_an_earlier_runs_model_keeps_its_vocabulary(earlier, tmp_path):
    """load-corpus with an earlier run's model/ tokenizes with its (compacted) vocabulary as it
    is, and train-gpt starts from that model, shape and all."""
    again = corpus(tmp_path, "b", "--init_from", str(earlier.model_dir))
    assert load_tokenizer(again.tokenizer_json).to_json() == \
        load_tokenizer(earlier.tokenizer_json).to_json()
    assert in_process("train-gpt", "--root", str(tmp_path), "--run", "b", "--init_from",
                      str(earlier.model_dir), *as_flags(TINY_FINETUNE), "--max_iters", "2") == 0
    tuned = json.loads((again.model_dir / "config.json").read_text())["finetuned_from"]
    assert tuned.startswith(str(earlier.model_dir.resolve()))


@pytest.mark.slow
@pytest.mark.parametrize("given", ["another-folder", "missing-folder", None])
def test_a_run_resumes_only_from_what_it_started_from(earlier, gpt2_root, tmp_path, capsys,
                                                       given):  # fmt: skip
    """A run with a checkpoint, given another --init_from (another model, a folder that does
    not exist, or none): refused in one line naming both, nothing trained; --resume never
    starts it over from the new one."""
    shutil.copytree(earlier.path, tmp_path / "earlier")
    run = RunDir.of(tmp_path, "earlier")
    latest = (run.ckpt_dir / "LATEST").read_text().strip()
    folder = str(gpt2_root / "gpt2-folder")
    another = shutil.copytree(folder, tmp_path / "another")  # the same model, elsewhere
    init_from = {"another-folder": ["--init_from", str(another)], None: [],
                 "missing-folder": ["--init_from", str(tmp_path / "gone")]}[given]  # fmt: skip
    capsys.readouterr()
    code = in_process("train-gpt", "--root", str(tmp_path), "--run", "earlier", *init_from,
                      *as_flags(TINY_FINETUNE), "--max_iters", "3")  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    new = init_from[1] if init_from else ""
    assert err[0].endswith(f"--init_from {new!r}: run 'earlier' started from --init_from "
                           f"{folder!r} (its checkpoint {latest}); give that to resume it, or "
                           "start over with --resume never")
    assert (run.ckpt_dir / "LATEST").read_text().strip() == latest
    if given == "another-folder":
        assert in_process("train-gpt", "--root", str(tmp_path), "--run", "earlier", *init_from,
                          *as_flags(TINY_FINETUNE), "--max_iters", "3", "--resume",
                          "never") == 0  # fmt: skip
        record = json.loads(run.init_from_json.read_text())
        assert record["init_from"] == str(another)


@pytest.mark.process
def test_a_sigkilled_fine_tuning_resumes_bit_exactly_without_the_pretrained_model(
        gpt2_root, tmp_path):  # fmt: skip
    """Killed after iteration 3 (a checkpoint at 2), resumed with the pretrained folder gone:
    the weights come from the checkpoint, and end equal to an uninterrupted run's."""
    folder = tmp_path / "gpt2"
    shutil.copytree(gpt2_root / "gpt2-folder", folder)
    for run in ("straight", "killed"):
        shutil.copytree(corpus(gpt2_root, "a", "--init_from", "gpt2").data_dir,
                        tmp_path / run / "data")
    flags = ["--init_from", str(folder), *as_flags(TINY_FINETUNE), "--max_iters", "6",
             "--ckpt_interval", "2"]
    assert in_process("train-gpt", "--root", str(tmp_path), "--run", "straight", *flags) == 0
    cmd = TRAIN_GPT.command(["--root", str(tmp_path), "--run", "killed", *flags],
                            python=[sys.executable])
    env = {**os.environ, **ONE_THREAD, "GPT_FAULT": "kill-rank-0@3"}
    killed = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert killed.returncode == -9, killed.stderr
    shutil.rmtree(folder)  # read at iteration 0 only
    assert in_process("train-gpt", "--root", str(tmp_path), "--run", "killed", *flags) == 0
    a = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    b = load_file(tmp_path / "killed" / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "killed" / "metrics" / "init_from.json").read_text()) == \
        json.loads((tmp_path / "straight" / "metrics" / "init_from.json").read_text())


@pytest.mark.slow
def test_two_ranks_fine_tune_from_the_hub_cache_as_one_process_does(gpt2_root, offline):
    """Under torchrun (two CPU ranks, gloo): rank 0 fetches "gpt2", the other reads the cache it
    filled; the two ranks train the same iterations as one process (no dropout: its masks are
    per-rank draws), and rank 0 alone writes the record of where the run started."""
    data = corpus(gpt2_root, "a", "--init_from", "gpt2").data_dir
    for run in ("one-rank", "two-ranks"):  # beside the Hub cache, in the root
        shutil.copytree(data, gpt2_root / run / "data")
    flags = ["--init_from", "gpt2", *as_flags(TINY_FINETUNE), "--dropout", "0", "--max_iters",
             "3", "--eval_interval", "3"]  # fmt: skip
    assert in_process("train-gpt", "--root", str(gpt2_root), "--run", "one-rank", *flags) == 0
    cmd = TRAIN_GPT.command(["--root", str(gpt2_root), "--run", "two-ranks", *flags],
                            torchrun=[sys.executable, "-m", "torch.distributed.run",
                                      "--standalone", "--nproc_per_node=2"])  # fmt: skip
    two = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ONE_THREAD},
                         timeout=300)  # fmt: skip
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count(f"init_from: hf://openai-community/gpt2 at {COMMIT}") == 1
    assert "2 process(es) on cpu" in two.stdout
    one, both = RunDir.of(gpt2_root, "one-rank"), RunDir.of(gpt2_root, "two-ranks")
    assert json.loads(both.init_from_json.read_text()) == \
        json.loads(one.init_from_json.read_text())
    pairs = list(zip(records(one), records(both), strict=True))
    assert [a["step"] for a, _ in pairs] == [1, 2, 3]  # written once, not once per rank
    for a, b in pairs:
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), a["step"]
    assert pairs[-1][1]["val_loss"] == pytest.approx(pairs[-1][0]["val_loss"], rel=1e-4)


@pytest.mark.slow
def test_a_model_that_cannot_fit_the_device_is_refused_with_the_estimate(gpt2_root, offline,
                                                                          monkeypatch, capsys):
    from gpt.training import memory_estimate

    corpus(gpt2_root, "a", "--init_from", "gpt2")
    monkeypatch.setattr(memory_estimate, "available_memory",
                        lambda device: (1 << 20, "the cpu has 0.0 GiB"))  # a 1 MiB device
    capsys.readouterr()
    assert finetune(gpt2_root, "a", "--max_iters", "1", "--resume", "never") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "need about" in err[0] and "GiB per device to train" in err[0]
    assert "the cpu has 0.0 GiB" in err[0]
    assert err[0].endswith("no --grad_accum, --activation_checkpointing or --lora_rank fits: "
                           "take a smaller model or a device with more memory")


# LoRA (--lora_rank): 4 iterations of rank-4 adapters on the GPT-2 folder, at a rate that moves
# them well off zero, with dropout and a weight average (what a resume must restore too), and a
# checkpoint at 2 to resume from.
LORA = ["--lora_rank", "4", "--learning_rate", "1e-2", "--max_iters", "4", "--ckpt_interval",
        "2", "--keep_last", "5", "--eval_interval", "2", "--dropout", "0.1", "--ema_decay", "0.9"]


@pytest.fixture(scope="module")
def lora_run(gpt2_root) -> RunDir:
    """A LoRA run from the GPT-2 folder on the comedy, its vocabulary compacted to the
    comedy's tokens (4,414 of GPT-2's 50,257 rows)."""
    folder = str(gpt2_root / "gpt2-folder")
    run = corpus(gpt2_root, "lora", "--init_from", folder)
    assert in_process("train-gpt", "--root", str(gpt2_root), "--run", "lora", "--init_from",
                      folder, *as_flags(TINY_FINETUNE), *LORA) == 0  # fmt: skip
    return run


def test_lora_adapters_load_onto_gpt2_with_the_merged_exports_logits(lora_run, gpt2_root):
    """The Must-show: PEFT's PeftModel of adapter/ on transformers' GPT-2 of the start computes
    model/'s logits (the merged export, which keeps the comedy's rows of the vocabulary) at
    those ids, and not the start's own."""
    import peft
    import transformers

    folder = gpt2_root / "gpt2-folder"
    config = json.loads((lora_run.adapter_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(folder.resolve())
    assert (config["peft_type"], config["r"], config["fan_in_fan_out"]) == ("LORA", 4, True)
    start = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    tuned = peft.PeftModel.from_pretrained(start, lora_run.adapter_dir).eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(lora_run.model_dir).eval()
    kept = torch.tensor(load_tokenizer(lora_run.tokenizer_json).kept)  # ours -> GPT-2's ids
    ids = torch.from_numpy(np.fromfile(lora_run.val_bin, dtype=np.uint16)[:16].astype(np.int64))
    with torch.no_grad():
        want = merged(ids[None]).logits
        got = tuned(kept[ids][None]).logits[..., kept]
        assert torch.allclose(got, want, atol=1e-4, rtol=0)
        with tuned.disable_adapter():
            assert (tuned(kept[ids][None]).logits[..., kept] - want).abs().max() > 1e-2


def test_lora_checkpoints_hold_the_adapters_alone_and_resume_exactly(
        lora_run, tmp_path, gpt2_root, capsys):  # fmt: skip
    """Every checkpoint file of weights holds the adapters (A and B of 4 projections in 2
    blocks) and AdamW's state is theirs; 2 iterations, stop, resume to 4 (the frozen weights
    read from --init_from again) gives the straight run's losses, adapters, average and
    adapter/, bit for bit. Frozen weights other than those it started from are refused."""
    step4 = lora_run.ckpt_step(4)
    for name in ("model.safetensors", "average.safetensors"):
        saved = load_file(step4 / name)
        assert len(saved) == 16 and all(".lora_A." in k or ".lora_B." in k for k in saved)
    optimizer = torch.load(step4 / "optimizer.pt", weights_only=True)
    assert len(optimizer["state"]) == 16

    resumed = RunDir.of(tmp_path, "lora")
    shutil.copytree(lora_run.path, resumed.path)
    shutil.rmtree(resumed.ckpt_step(4))
    shutil.rmtree(resumed.model_dir)
    shutil.rmtree(resumed.adapter_dir)
    resumed.latest.write_text("step-2\n")
    flags = ["--root", str(tmp_path), "--run", "lora", "--init_from",
             str(gpt2_root / "gpt2-folder"), *as_flags(TINY_FINETUNE), *LORA]  # fmt: skip
    assert in_process("train-gpt", *flags) == 0
    assert "resumed from step-2" in capsys.readouterr().out
    losses = [[(r["step"], r.get("loss"), r.get("val_loss")) for r in records(run)]
              for run in (lora_run, resumed)]
    assert losses[0] == losses[1] and len(losses[0]) == 4
    for name in ("model.safetensors", "average.safetensors"):
        assert_same_weights(load_file(resumed.ckpt_step(4) / name), load_file(step4 / name), name)
    name = "adapter_model.safetensors"
    assert_same_weights(load_file(resumed.adapter_dir / name),
                        load_file(lora_run.adapter_dir / name), name)

    # other adapters are another model; a resume without them too
    for other in (["--lora_rank", "8"], ["--lora_rank", "0"]):
        assert in_process("train-gpt", *flags, *other) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "trained with a different model" in err[0]
        assert f"lora_rank 4 -> {other[1]}" in err[0]

    record = json.loads(resumed.init_from_json.read_text())
    resumed.init_from_json.write_text(json.dumps({**record, "weights_sha256": "0" * 64}))
    resumed.latest.write_text("step-2\n")
    assert in_process("train-gpt", *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "are not those the run's adapters were trained on" in err[0]

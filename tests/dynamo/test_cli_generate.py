"""``hfexport export --task`` and ``hfexport generate``: a task export checked by greedy generation against eager,
generation from the command line with the same token ids as ``model.generate(do_sample=False)``, and the usage
errors of both (exit status 2, one line naming what was wrong)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

import hfexport
from helpers import tiny_model
from hfexport import cli

MAX_CACHE_LEN, MAX_BATCH = 32, 2


def _tokenizer():
    """A word-level tokenizer over the tiny models' 100 ids (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``w3`` ... ``w99``),
    built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 100)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<pad>")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny LlamaForCausalLM and its directory (weights, config, tokenizer)."""
    model = tiny_model("llama")
    directory = tmp_path_factory.mktemp("llama")
    model.save_pretrained(directory)
    _tokenizer().save_pretrained(directory)
    return model, directory


@pytest.fixture(scope="module")
def artifact(llama, tmp_path_factory):
    """``hfexport export LLAMA --task text-generation``, in-process: the artifact directory."""
    out = tmp_path_factory.mktemp("exports") / "gen"
    code = cli.main(["export", str(llama[1]), "--task", "text-generation", "--max-cache-len", str(MAX_CACHE_LEN),
                     "--max-batch", str(MAX_BATCH), "-o", str(out)])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def bare_artifact(artifact, tmp_path_factory):
    """The same export without tokenizer files (as the Python API saves it): loaded and saved again, less those."""
    out = tmp_path_factory.mktemp("exports") / "bare"
    loaded = hfexport.load(artifact)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        del loaded.extra_files[name]
    loaded.save_pretrained(out)
    return out


def _eager(model, rows, pad, max_new_tokens):
    longest = max(map(len, rows))
    ids = torch.tensor([[pad] * (longest - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens).tolist()


def _printed_sequences(stdout):
    """The ``sequence R: prompt ids | new ids`` lines as lists of ids (the ``|`` dropped)."""
    return [[int(t) for t in line.split(":", 1)[1].split() if t != "|"]
            for line in stdout.splitlines() if line.startswith("sequence ")]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "hfexport.cli", *map(str, args)], capture_output=True, text=True)


# ── the end-to-end path, as a user runs it ──────────────────────────────────────────────────────────────
@pytest.mark.slow
def test_export_then_generate_in_fresh_processes_equals_eager_generate(llama, tmp_path):
    model, directory = llama
    out = tmp_path / "gen"
    export = _run("export", directory, "--task", "text-generation", "--max-cache-len", MAX_CACHE_LEN,
                  "--max-batch", MAX_BATCH, "-o", out)  # a batch of 2 below (the default max_batch is 1)
    assert export.returncode == 0, export.stderr
    assert "exporting LlamaForCausalLM" in export.stderr  # the head config.architectures names
    assert export.stdout.startswith("PASSED: token ids equal eager LlamaForCausalLM.generate(do_sample=False)")

    rows = [[5, 6, 7, 8], [9, 10]]
    generate = _run("generate", out, "--input-ids", "5,6,7,8", "--input-ids", "9, 10", "--max-new-tokens", 8)
    assert generate.returncode == 0, generate.stderr
    # the shorter prompt is left-padded with the tokenizer's pad id (0), copied into the artifact by the export
    assert _printed_sequences(generate.stdout) == _eager(model, rows, pad=0, max_new_tokens=8)
    assert "prefill" in generate.stdout and "tokens/s" in generate.stdout


# ── export --task ───────────────────────────────────────────────────────────────────────────────────────
def test_export_task_records_the_generation_check_and_copies_the_tokenizer(artifact):
    manifest = json.loads((artifact / "export.json").read_text())
    assert manifest["task"] == "text-generation" and manifest["model_class"] == "LlamaForCausalLM"
    assert list(manifest["components"]) == ["decoder"]  # one program for prefill and decode
    assert manifest["generation"]["max_cache_len"] == MAX_CACHE_LEN and manifest["generation"]["max_batch"] == MAX_BATCH
    check = manifest["verification"]
    assert check["kind"] == "generation" and check["passed"] is True and check["first_difference"] is None
    assert check["inputs"] == {"input_ids": [2, 5], "attention_mask": [2, 5]} and check["max_new_tokens"] == 8
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(manifest["files"])  # hashed like every file


@pytest.mark.parametrize(("args", "message"), [
    (["--no-task", "--max-cache-len", "16"], "--max-cache-len bounds the programs of a task export: pass --task text-generation"),
    (["--task", "text-generation", "--dynamic"], "drop --dynamic"),
    (["--task", "text-generation", "--max-batch", "0"], "--max-batch must be a positive number"),
    (["--task", "text-generaton"], "unknown task 'text-generaton' (did you mean 'text-generation'?); backend "
                                   "'dynamo' exports the tasks text-generation, text2text-generation"),
    (["--no-task", "--prefill-chunk", "4"], "--prefill-chunk bounds the programs of a task export: pass --task text-generation"),
    (["--task", "text-generation", "--prefill-chunk", "1"], "prefill_chunk must be an int from 2 to max_cache_len=64"),
    (["--task", "text2text-generation", "--prefill-chunk", "4"], "--prefill-chunk bounds a decoder's prompt chunks"),
    (["--task", "text-generation", "--no-task"], "--no-task exports one forward pass: drop it or --task"),
    (["--task", "text-generation", "--max-cache-len", "65"],
     "max_cache_len=65 exceeds the model's 64 positions (max_position_embeddings): lower it"),
])
def test_export_task_usage_errors(llama, tmp_path, capsys, args, message):
    assert cli.main(["export", str(llama[1]), *args, "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and message in err
    assert not (tmp_path / "o").exists()


def test_an_unknown_task_is_refused_before_the_model_or_the_toolchain_loads(tmp_path):
    """The backend's declaration names its tasks (``Backend.tasks``, no toolchain import): a typo is refused with a
    did-you-mean before the model directory is read (its config.json here is not a model's) and before torch is
    imported."""
    model = tmp_path / "not-a-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    code = ("import sys; from hfexport import cli; rc = cli.main(['export', sys.argv[1], '--task', 'text-generaton', "
            "'-b', 'onnx', '-o', sys.argv[2]]); print('torch imported:', 'torch' in sys.modules); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, str(model), str(tmp_path / "o")], capture_output=True,
                          text=True)
    assert done.returncode == 2, done.stderr
    assert "unknown task 'text-generaton' (did you mean 'text-generation'?); backend 'onnx'" in done.stderr
    assert "torch imported: False" in done.stdout and not (tmp_path / "o").exists()


def test_a_misspelled_task_is_named_as_such_with_the_demo_too(tmp_path, capsys):
    """The task's name is checked before what the task needs (a generative model, not --demo's encoder); a name
    near no task gets no "did you mean", and the message says a plain export takes no --task."""
    assert cli.main(["export", "--demo", "--task", "text-generaton", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown task 'text-generaton' (did you mean 'text-generation'?)" in err and "sentence" not in err
    assert cli.main(["export", "--demo", "--task", "feature-extration", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown task 'feature-extration'; backend 'dynamo' exports the tasks" in err and "did you mean" not in err
    assert "a single forward pass (feature extraction, classification, ...) without --task" in err
    assert not (tmp_path / "o").exists()


def test_export_task_refuses_a_model_without_a_generation_head(tmp_path, capsys):
    tiny_model("bert").save_pretrained(tmp_path / "bert")
    assert cli.main(["export", str(tmp_path / "bert"), "--task", "text-generation", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "holds a model without a generation head (config.architectures names BertModel)" in err
    assert "...ForCausalLM" in err and not (tmp_path / "o").exists()


def test_export_task_refuses_the_demo_encoder(tmp_path, capsys):
    assert cli.main(["export", "--demo", "--task", "text-generation", "-o", str(tmp_path / "o")]) == 2
    assert "the --demo model is a sentence encoder" in capsys.readouterr().err


# ── generate ────────────────────────────────────────────────────────────────────────────────────────────
def test_generate_input_ids_equals_eager_generate(llama, artifact, capsys):
    assert cli.main(["generate", str(artifact), "--input-ids", "5,6,7", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert _printed_sequences(out) == _eager(llama[0], [[5, 6, 7]], pad=0, max_new_tokens=8)
    assert out.splitlines()[0].startswith("sequence 0: 5 6 7 | ")
    stats = out.splitlines()[-1]
    assert stats.startswith("prefill ") and " ms, decode 7 steps x batch 1 in " in stats and stats.endswith("tokens/s")


def test_generate_batch_as_json_equals_eager_generate(llama, bare_artifact, capsys):
    args = ["generate", str(bare_artifact), "--input-ids", "11,12,13,14", "--input-ids", "15", "--max-new-tokens", "6",
            "--pad-token-id", "0", "--json"]
    assert cli.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    with torch.no_grad():
        eager = llama[0].generate(torch.tensor([[11, 12, 13, 14], [0, 0, 0, 15]]),
                                  attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 0, 1]]), do_sample=False,
                                  max_new_tokens=6, pad_token_id=0)
    assert result["sequences"] == eager.tolist() and result["prompt_length"] == 4
    assert result["stats"]["decode_steps"] == 5 and result["stats"]["prefill_s"] > 0 and "texts" not in result


def test_generate_prompt_prints_the_decoded_text(llama, artifact, bare_artifact, capsys):
    tokenizer = _tokenizer()
    eager = _eager(llama[0], [tokenizer("w5 w6 w7")["input_ids"]], pad=0, max_new_tokens=5)[0]
    expected = tokenizer.decode(eager[3:], skip_special_tokens=True)
    # the tokenizer the export copied into the artifact, and one given with --tokenizer
    for args in ([str(artifact)], [str(bare_artifact), "--tokenizer", str(llama[1])]):
        assert cli.main(["generate", *args, "--prompt", "w5 w6 w7", "--max-new-tokens", "5"]) == 0
        out = capsys.readouterr().out
        assert _printed_sequences(out) == [eager]
        assert f'text 0: "w5 w6 w7" + {json.dumps(expected)}' in out.splitlines()


@pytest.mark.parametrize(("args", "message"), [
    ([], "give the prompt as token ids (--input-ids 1,2,3; repeat it for a batch) or as text (--prompt TEXT"),
    (["--input-ids", "1,2", "--prompt", "w5"], "not both"),
    (["--input-ids", "1,x"], "--input-ids '1,x': 'x' is not a token id"),
    (["--input-ids", ","], "--input-ids ',' holds no token ids"),
    (["--input-ids", "1,,2"], "--input-ids '1,,2' has an empty item between commas"),
    (["--input-ids", "1,2", "--eos-token-id", "two"], "--eos-token-id 'two': 'two' is not a token id"),
    (["--input-ids", "1,2", "--max-new-tokens", "0"], "--max-new-tokens must be 1 or more, got 0"),
    (["--input-ids", "1,2", "--max-new-tokens", None], "pass --max-new-tokens N"),
    (["--input-ids", "1,2", "--max-new-tokens", "31"],
     "a prompt of 2 tokens plus max_new_tokens=31 exceeds this export's max_cache_len=32"),
    (["--input-ids", "1", "--input-ids", "2", "--input-ids", "3"], "a batch of 3 exceeds this export's max_batch=2"),
    (["--input-ids", "1,100"], "input_ids holds ids outside the vocabulary [0, 100)"),
    (["--input-ids", "1,2", "--revision", "main"], "--revision is for a Hub repository id"),
    (["--prompt", "w5", "--tokenizer", "/nonexistent/tok"], "--tokenizer /nonexistent/tok is not a directory"),
    (["--prompt", "w5", "--audio", "/nonexistent.wav"], "--audio /nonexistent.wav is not a file"),
    (["--input-ids", "5", "--audio", "/nonexistent.wav"], "--audio needs the prompt as text"),
])
def test_generate_usage_errors(artifact, capsys, args, message):
    if None in args:
        args = args[:args.index(None) - 1]
    elif "--max-new-tokens" not in args and args != []:
        args = [*args, "--max-new-tokens", "4"]
    assert cli.main(["generate", str(artifact), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1], err


def test_generate_refuses_a_missing_or_non_artifact_directory(llama, tmp_path, capsys):
    assert cli.main(["generate", str(tmp_path / "missing"), "--input-ids", "1", "--max-new-tokens", "2"]) == 2
    assert f"{tmp_path / 'missing'} is not a directory: give the directory of a saved export" in capsys.readouterr().err
    assert cli.main(["generate", str(llama[1]), "--input-ids", "1", "--max-new-tokens", "2"]) == 2
    assert f"{llama[1]} holds no export.json" in capsys.readouterr().err


def test_generate_prompt_without_a_tokenizer_says_where_to_get_one(bare_artifact, capsys):
    assert cli.main(["generate", str(bare_artifact), "--prompt", "w5", "--max-new-tokens", "2"]) == 2
    assert (f"error: --prompt needs a tokenizer, and {bare_artifact} holds no tokenizer files: pass --tokenizer DIR"
            in capsys.readouterr().err)


def test_generate_refuses_an_artifact_exported_without_a_task(tmp_path, capsys):
    hfexport.export(tiny_model("bert"), backend="dynamo").save_pretrained(tmp_path / "bert")
    capsys.readouterr()  # the CLI's output only (a first import of torchao by transformers logs on its own)
    assert cli.main(["generate", str(tmp_path / "bert"), "--input-ids", "1,2", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "was exported for one forward pass and cannot generate: export it with task='text-generation'" in err
    assert "hfexport export MODEL --task" in err and len(err.strip().splitlines()) == 1
    # refused from export.json alone: no runtime (nor torch) loads first
    code = ("import sys; from hfexport import cli; rc = cli.main(['generate', sys.argv[1], '--input-ids', '1,2', "
            "'--max-new-tokens', '2']); print('torch imported:', 'torch' in sys.modules); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "bert")], capture_output=True, text=True)
    assert done.returncode == 2 and "cannot generate" in done.stderr and "torch imported: False" in done.stdout


def test_generate_runtime_failure_exits_1_with_one_line(artifact, tmp_path, capsys):
    broken = shutil.copytree(artifact, tmp_path / "broken")
    program = next(p for p in (broken / "decoder").iterdir() if p.is_file())
    data = bytearray(program.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the manifest's SHA-256 no longer matches
    program.write_bytes(bytes(data))
    assert cli.main(["generate", str(broken), "--input-ids", "1,2", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("generating with the dynamo export of LlamaForCausalLM")  # said before loading
    errors = [line for line in err if not line.startswith(("generating ", "[hfexport "))]
    assert len(errors) == 1 and errors[0].startswith("error: ") and "decoder/" in errors[0] and "--debug" in errors[0]


def test_generate_help_teaches_by_example():
    out = _run("generate", "--help")
    assert out.returncode == 0
    for text in ("--input-ids 5,6,7 --input-ids 8,9", "--prompt", "--tokenizer", "--max-new-tokens",
                 "hfexport export ./my-llm --task text-generation", "Exit status"):
        assert text in out.stdout
    assert "hfexport generate out/gen" in _run("--help").stdout


def test_a_quantized_task_export_is_checked_by_cosine_and_reports_its_token_agreement():
    """``export --task ... --quantize int4`` must not fail its check because its greedy ids part from float eager's
    (a fresh user's int4 and 8da4w task exports exited 3 at position 5 while every program passed its cosine): the
    check passes on the programs' recorded verification and reports the share of new positions that agree."""
    from hfexport_dynamo.tasks.export_command import _generation_check

    torch.manual_seed(0)
    model = tiny_model("llama", vocab_size=256)
    exported = hfexport.export(model, backend="onnx", task="text-generation", quantize="int4", max_cache_len=32)
    assert all(c["verification"]["passed"] for c in exported.manifest["components"].values())
    check = _generation_check(model, exported, max_new_tokens=8)
    report = check["report"]
    assert report["passed"] and report["quantized"] == ["int4"]
    assert 0.0 <= report["token_agreement"] <= 1.0
    if report["first_difference"] is not None:  # the ids parted: said, with how much they agree
        assert "agree at" in check["text"] and "int4" in check["text"], check["text"]


@pytest.mark.parametrize("key,value,message", [
    ("auto_map", {"AutoTokenizer": ["evil.EvilTokenizer", None]}, "tokenizer_config.json:auto_map names"),
    ("tokenizer_class", "EvilTokenizer", "tokenizer_config.json:tokenizer_class names 'EvilTokenizer'"),
])
def test_a_tokenizer_config_that_would_run_code_is_refused_by_name(artifact, tmp_path, capsys, key, value, message):
    """Issue 43: an ``auto_map`` made transformers ask "run custom code? [y/N]" on standard input, and ``y`` ran the
    artifact's Python. Refused by name before transformers reads it (and from_pretrained passes
    trust_remote_code=False), unless --trust-remote-code; the artifact's module never runs."""
    import shutil

    from crafting import rehash

    crafted = tmp_path / "gen"
    shutil.copytree(artifact, crafted)
    marker = tmp_path / "ran"
    (crafted / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                      "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n")
    config = json.loads((crafted / "tokenizer_config.json").read_text())
    config[key] = value
    (crafted / "tokenizer_config.json").write_text(json.dumps(config))
    rehash(crafted)
    assert cli.main(["generate", str(crafted), "--prompt", "w5", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert message in err and "--trust-remote-code" in err, err
    assert not marker.exists()


@pytest.mark.parametrize("part", ["normalizer", "decoder"])
def test_a_tokenizer_that_multiplies_the_text_is_refused_before_encoding(artifact, tmp_path, capsys, part):
    """Issue 43: a Sequence of Replace steps multiplies the text (7 x Replace("w" -> 10 x "w") made each "w"
    10,000,000 characters: +3 GiB in the Rust library before the prompt's length was checked). Refused before any
    encoding, naming the bound; the same tokenizer at the bound (2 x 16 = 256) still loads."""
    from crafting import rehash

    from hfexport_dynamo.tasks.tokenizer_files import TOKENIZER_MAX_EXPANSION

    crafted = tmp_path / "gen"
    shutil.copytree(artifact, crafted)
    tokenizer = json.loads((crafted / "tokenizer.json").read_text())
    step = {"type": "Replace", "pattern": {"String": "w"}, "content": "w" * 10}
    key = {"normalizer": "normalizers", "decoder": "decoders"}[part]
    tokenizer[part] = {"type": "Sequence", key: [step] * 7}
    (crafted / "tokenizer.json").write_text(json.dumps(tokenizer))
    rehash(crafted)
    assert cli.main(["generate", str(crafted), "--prompt", "w5", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert f"has a {part} that makes up to 10,000,000 characters of one, over the bound of 256" in err, err

    tokenizer[part] = {"type": "Sequence", key: [{**step, "content": "w" * 16}] * 2}  # 256: at the bound
    assert TOKENIZER_MAX_EXPANSION == 256
    (crafted / "tokenizer.json").write_text(json.dumps(tokenizer))
    rehash(crafted)
    cli.main(["generate", str(crafted), "--prompt", "w5", "--max-new-tokens", "2"])
    assert "over the bound of 256" not in capsys.readouterr().err


def test_a_tokenizer_panic_is_an_error_naming_the_files(tmp_path):
    """A crafted tokenizer.json can make the Rust tokenizers library panic (``PanicException``, a BaseException that
    ``except Exception`` lets through): it is turned into an error that names the directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from hfexport.commands import UsageError
    from hfexport_dynamo.tasks.tokenizer_files import _tokenizer_call

    tokenizer = Tokenizer(models.WordLevel({"w": 0, "<unk>": 1}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    crafted = json.loads(tokenizer.to_str())
    crafted["truncation"] = {"direction": "Right", "max_length": 1, "strategy": "LongestFirst", "stride": 1}
    tokenizer = Tokenizer.from_str(json.dumps(crafted))
    with pytest.raises(UsageError, match=rf"the tokenizer of {tmp_path} failed to tokenize .*stride.*damaged or "
                                         "crafted"):
        _tokenizer_call(lambda: tokenizer.encode("w w w"), tmp_path, "tokenize")


def test_a_tokenizer_json_that_panics_the_early_length_check_does_not_escape(artifact, tmp_path, capsys):
    """The early --prompt length check (tokenizer.json alone, before load) let the Rust panic of a crafted
    tokenizer.json (a truncation stride of max_length: ``PanicException``, a ``BaseException``) escape ``cli.main`` as
    a traceback. It now leaves the prompt to the checked copy's tokenizer (transformers sets no truncation: the
    prompt generates)."""
    from crafting import copy_artifact, rehash

    directory = copy_artifact(artifact, tmp_path)
    crafted = json.loads((directory / "tokenizer.json").read_text())
    crafted["truncation"] = {"direction": "Right", "max_length": 1, "strategy": "LongestFirst", "stride": 1}
    (directory / "tokenizer.json").write_text(json.dumps(crafted))
    rehash(directory)
    assert cli.main(["generate", str(directory), "--prompt", "w5 w6 w7", "--max-new-tokens", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sequences"][0][:3] == [5, 6, 7]


def _other_tokenizer_json() -> bytes:
    """A tokenizer.json of the same words with other ids (``w5`` is 94): one a writer might swap in."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": 102 - i for i in range(3, 100)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer.to_str().encode()


def test_a_tokenizer_swapped_after_the_check_is_refused_or_never_read(artifact, tmp_path):
    """Issue 43: ``generate`` built its tokenizer with ``AutoTokenizer.from_pretrained(artifact)``, which reopened
    tokenizer.json by path after ``load`` had hashed it: a file swapped in between was read unchecked (other token
    ids, no error). Now transformers reads a private copy of the checked bytes: a swap before the copy is refused
    (IntegrityError), one after it never reaches the tokenizer (the original ids). Each fails with from_pretrained
    over the artifact's directory put back."""
    import os
    import stat

    from crafting import copy_artifact

    from hfexport import IntegrityError
    from hfexport_dynamo.tasks.generate_command import _tokenizer_files, load_tokenizer

    directory = copy_artifact(artifact, tmp_path)
    other = _other_tokenizer_json()
    original = (directory / "tokenizer.json").read_bytes()
    exported = hfexport.load(directory)  # the check: every file hashed against export.json
    with _tokenizer_files(directory, directory, exported.manifest) as files:  # as generate builds it
        (directory / "tokenizer.json").write_bytes(other)  # swapped after the copy: never read
        assert load_tokenizer(files, shown=directory)("w5 w6")["input_ids"] == [5, 6]  # [97, 96] from the swap
        assert files != directory and stat.S_IMODE(os.stat(files).st_mode) == 0o700
    assert not files.exists()  # the private copy is removed
    staged = directory / "tokenizer.json.swap"  # swapped after load's check, before the copy: refused
    staged.write_bytes(other)
    os.replace(staged, directory / "tokenizer.json")
    with pytest.raises(IntegrityError, match="tokenizer.json changed while it was loaded"):
        with _tokenizer_files(directory, directory, exported.manifest) as files:
            load_tokenizer(files, shown=directory)
    (directory / "tokenizer.json").write_bytes(original)
    with _tokenizer_files(directory, directory, exported.manifest) as files:  # the original again: loads
        assert load_tokenizer(files, shown=directory)("w5 w6")["input_ids"] == [5, 6]


def test_a_tokenizer_file_the_manifest_does_not_hash_is_refused(artifact, tmp_path, capsys):
    """A tokenizer file dropped into an artifact beside those export.json hashes (special_tokens_map.json, never
    checked) was read by transformers; it is refused by name, and generate exits 2 with one error line."""
    from crafting import copy_artifact

    directory = copy_artifact(artifact, tmp_path)
    (directory / "special_tokens_map.json").write_text(json.dumps({"bos_token": "w9"}))
    assert cli.main(["generate", str(directory), "--prompt", "w5", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{directory / 'special_tokens_map.json'} is a tokenizer or processor file that" in err, err
    assert "does not hash" in err and len([line for line in err.splitlines() if line.startswith("error:")]) == 1, err


def test_as_transformers_reads_the_checked_config(artifact, tmp_path):
    """``as_transformers(load(dir))`` read config.json with AutoConfig.from_pretrained(dir) after the check (by path,
    and an ``auto_map`` would have asked to run code): now from the checked bytes, by its model_type's class."""
    from crafting import copy_artifact

    from hfexport import IntegrityError
    from hfexport_dynamo.tasks import as_transformers

    directory = copy_artifact(artifact, tmp_path)
    exported = hfexport.load(directory)
    assert type(as_transformers(exported).config).__name__ == "LlamaConfig"
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoConfig": "evil.Config"}}))
    with pytest.raises(IntegrityError, match="config.json changed while it was loaded"):
        as_transformers(exported)


# ── refused before any model or runtime loads (issue 48) ─────────────────────────────────────────────────────────
_EARLY = """
import json, sys, time
from hfexport import cli
results = []
for argv in json.loads(sys.argv[1]):
    start = time.perf_counter()
    code = cli.main(argv)
    results.append([code, time.perf_counter() - start])
print(json.dumps({"results": results, "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}))
"""


def test_mistakes_are_refused_within_3_s_before_any_model_or_runtime_loads(artifact, llama, tmp_path):
    """In one new process (each case a ``cli.main`` call, timed): a read-only output directory, a model directory
    with config.json and no weights, ``generate --prompt`` on a single-forward artifact (it said to pass
    --tokenizer), a --prompt batch beyond max_batch and a --prompt beyond max_cache_len, a model whose config maps
    its classes to its repository's code without --trust-remote-code, a Hub id the (empty, offline) cache lacks,
    --revision with a local directory; exit 2 with what was wrong, each within 3 s, and neither torch nor
    transformers imported."""
    hfexport.export(tiny_model("bert", layers=1), backend="dynamo").save_pretrained(tmp_path / "bert")
    (tmp_path / "noweights").mkdir()
    shutil.copy(llama[1] / "config.json", tmp_path / "noweights")
    readonly = "/sys/hfexport-test/out"  # sysfs takes no new file, as root too
    (tmp_path / "remote").mkdir()
    config = json.loads((llama[1] / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_mine.MyLlama"}
    (tmp_path / "remote" / "config.json").write_text(json.dumps(config))
    shutil.copy(llama[1] / "model.safetensors", tmp_path / "remote")
    long_prompt = " ".join(f"w{i}" for i in range(3, 33))  # 30 tokens + 4 new > max_cache_len 32
    cases = [
        (["export", str(llama[1]), "--task", "text-generation", "-o", readonly],
         f"output directory {readonly} cannot be written: /sys refuses new files"),
        (["export", str(tmp_path / "noweights"), "-o", str(tmp_path / "o")],
         f"{tmp_path / 'noweights'} has config.json but no weights"),
        (["generate", str(tmp_path / "bert"), "--prompt", "hi", "--max-new-tokens", "4"],
         "was exported for one forward pass and cannot generate"),
        (["generate", str(artifact), "--prompt", "w5", "--prompt", "w6", "--prompt", "w7", "--max-new-tokens", "4"],
         "a batch of 3 exceeds this export's max_batch=2: give at most 2 --prompt"),
        (["generate", str(artifact), "--prompt", long_prompt, "--max-new-tokens", "4"],
         "a prompt of 30 tokens plus max_new_tokens=4 exceeds this export's max_cache_len=32"),
        (["export", str(tmp_path / "remote"), "-o", str(tmp_path / "o")],
         "auto_map: modeling_mine.MyLlama): loading it runs that code; pass --trust-remote-code if you trust"),
        (["export", "nobody-here/no-such-model", "-o", str(tmp_path / "o")],
         "nobody-here/no-such-model is not a local directory, HF_HUB_OFFLINE is set, and the Hugging Face cache"),
        (["export", str(llama[1]), "--revision", "v1", "-o", str(tmp_path / "o")],
         "--revision is for a Hub model id (org/name)"),
    ]
    import os

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    run = subprocess.run([sys.executable, "-c", _EARLY, json.dumps([argv for argv, _ in cases])], capture_output=True,
                         text=True, env=env)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == len(cases), run.stderr
    for (argv, message), (code, seconds), error in zip(cases, report["results"], errors, strict=True):
        assert code == 2 and message in error, (argv, error)
        assert seconds < 3, (argv, seconds)
    assert not report["torch"] and not report["transformers"], report
    assert not (tmp_path / "o").exists()


def _first_lines(*args, count=1, env=None):
    """The first ``count`` stderr lines of ``hfexport ARGS`` in a new process and the seconds from the start to the
    first (the process is then stopped: only its first answers are measured)."""
    import time

    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "hfexport.cli", *map(str, args)], stderr=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        lines = [process.stderr.readline().rstrip("\n")]
        seconds = time.perf_counter() - start
        lines += [process.stderr.readline().rstrip("\n") for _ in range(count - 1)]
        return lines, seconds
    finally:
        process.kill()
        process.wait()


def _first_line(*args):
    [line], seconds = _first_lines(*args)
    return line, seconds


def test_the_first_line_of_export_and_generate_comes_within_2_s(llama, artifact, tmp_path):
    """What, from where, to where and with which backend, before torch, the toolchain or the model load (a user
    saw nothing for a minute)."""
    line, seconds = _first_line("export", llama[1], "--task", "text-generation", "-b", "onnx", "-o", tmp_path / "o")
    assert line == (f"exporting LlamaForCausalLM from {llama[1]} with backend 'onnx' for task 'text-generation' "
                    f"to {tmp_path / 'o'}"), line
    assert seconds < 2, seconds
    line, seconds = _first_line("generate", artifact, "--input-ids", "5,6", "--max-new-tokens", "2")
    assert line == (f"generating with the dynamo export of LlamaForCausalLM (text-generation, max_cache_len "
                    f"{MAX_CACHE_LEN}, max_batch {MAX_BATCH}) from {artifact}"), line
    assert seconds < 2, seconds


def test_verify_of_a_task_export_shows_no_none_and_no_skip_as_a_pass(artifact, capsys):
    """``hfexport verify`` printed ``✅ run skipped`` and ``max abs diff None`` for a generation artifact: a check
    that did not run is marked as such, and the recorded verification says what it measured (token ids)."""
    assert cli.main(["verify", str(artifact)]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "✅ run       skipped" not in out, out
    assert "·  run       not run: component 'decoder' takes inputs whose shapes the manifest does not fix" in out
    assert ("·  recorded  verification PASSED, greedy token ids equal LlamaForCausalLM.generate(do_sample=False) at "
            "input_ids=[2, 5], attention_mask=[2, 5]") in out, out


@pytest.mark.slow
def test_export_task_on_openvino_writes_the_tokenizer_ir_for_openvino_genai(llama, tmp_path):
    """``export DIR --task text-generation --backend openvino``: DIR's tokenizer goes to the backend's
    ``tokenizer`` option, converted by openvino_tokenizers beside the IR (what OpenVINO GenAI's LLMPipeline reads)."""
    out = tmp_path / "gen"
    code = cli.main(["export", str(llama[1]), "--task", "text-generation", "--backend", "openvino",
                     "--max-cache-len", str(MAX_CACHE_LEN), "-o", str(out)])
    assert code == 0
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["components"]["decoder"]["openvino"]["genai"]["tokenizer"] == "converted"
    for name in ("openvino_model.xml", "openvino_tokenizer.xml", "openvino_detokenizer.xml", "generation_config.json",
                 "config.json"):  # at the root, where LLMPipeline(dir) reads them
        assert (out / name).is_file(), name
        assert name in manifest["files"]  # hashed like every file


def test_a_causal_lm_exports_for_text_generation_unless_told_and_says_so(llama, tmp_path):
    (first, inferred), seconds = _first_lines("export", llama[1], "-b", "onnx", "-o", tmp_path / "o", count=2)
    assert first.endswith("with backend 'onnx' for task 'text-generation' to " + str(tmp_path / "o")), first
    assert inferred.startswith("task 'text-generation' inferred from LlamaForCausalLM (config.json's architectures): "
                               "pass --no-task to export one forward pass"), inferred
    (first, _), _ = _first_lines("export", llama[1], "-b", "onnx", "--no-task", "-o", tmp_path / "o", count=2)
    assert first == f"exporting LlamaForCausalLM from {llama[1]} with backend 'onnx' to {tmp_path / 'o'}", first


def _hub_cache(llama, cache):
    """A Hugging Face cache holding ``tiny-org/tiny-llama`` at main, as snapshot_download leaves it."""
    commit = "0" * 40
    snapshot = cache / "models--tiny-org--tiny-llama" / "snapshots" / commit
    shutil.copytree(llama[1], snapshot)
    (cache / "models--tiny-org--tiny-llama" / "refs").mkdir()
    (cache / "models--tiny-org--tiny-llama" / "refs" / "main").write_text(commit)
    return snapshot


def test_a_hub_model_id_is_fetched_through_huggingface_hub_offline_from_its_cache(llama, tmp_path):
    import os

    snapshot = _hub_cache(llama, tmp_path / "hub")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    lines, seconds = _first_lines("export", "tiny-org/tiny-llama", "-b", "onnx", "-o", tmp_path / "o", count=4,
                                  env=env)
    assert lines[0] == f"exporting tiny-org/tiny-llama from the Hugging Face Hub with backend 'onnx' to {tmp_path / 'o'}"
    assert seconds < 2, seconds
    assert lines[2].startswith("[hfexport ") and "fetching tiny-org/tiny-llama's config, weights and tokenizer" in \
        lines[2] and lines[2].endswith("s") and "done in" in lines[2], lines
    assert lines[3].startswith("exporting LlamaForCausalLM from tiny-org/tiny-llama with backend 'onnx' for task "
                               "'text-generation'"), lines
    assert (snapshot / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_hub_model_in_bf16_exports_and_generates_as_bf16_eager(llama, tmp_path):
    import os

    _hub_cache(llama, tmp_path / "hub")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    run = subprocess.run([sys.executable, "-m", "hfexport.cli", "export", "tiny-org/tiny-llama", "--dtype", "bf16",
                          "--max-cache-len", "32", "-o", str(tmp_path / "o")], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("PASSED: token ids equal eager LlamaForCausalLM.generate"), run.stdout
    manifest = json.loads((tmp_path / "o" / "export.json").read_text())
    assert manifest["task"] == "text-generation"
    assert "bfloat16" in json.dumps(manifest["components"]["decoder"]["outputs"]), manifest["components"]["decoder"]


_CUSTOM_MODELING = '''
from transformers import LlamaForCausalLM


class MyLlama(LlamaForCausalLM):
    """A model whose code lives in its folder: Llama with its logits halved (so that its outputs are its own)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 0.5
        return out
'''


@pytest.mark.slow  # a CLI export in a new process (61 s loaded); the refusal without the flag stays in the default set
def test_trust_remote_code_exports_a_local_model_with_its_own_code(llama, tmp_path):
    """``hfexport export DIR --trust-remote-code`` on a model folder whose config.json maps ``AutoModelForCausalLM``
    to a module in the folder (offline, in a new process with its own modules cache): the folder's class is what is
    exported (the manifest's ``model_class``), generating as that class's eager ``generate`` (the export's check);
    without the flag the same folder is refused (``test_mistakes_are_refused_within_3_s...``)."""
    import os

    folder = tmp_path / "custom"
    shutil.copytree(llama[1], folder)
    (folder / "modeling_mine.py").write_text(_CUSTOM_MODELING)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_mine.MyLlama"}
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run([sys.executable, "-m", "hfexport.cli", "export", str(folder), "--trust-remote-code",
                           "--max-cache-len", "16", "-o", str(out)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["model_class"] == "MyLlama" and "modeling_mine" in manifest["model_module"]
    assert manifest["task"] == "text-generation" and manifest["verification"]["passed"] is True
    assert (tmp_path / "modules").is_dir()  # transformers copied the folder's module into its modules cache

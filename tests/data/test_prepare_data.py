"""prepare_data: text and JSONL -> Megatron .bin/.idx with any offline tokenizer, byte for
byte what Megatron-LM's tools/preprocess_data.py writes; bad input refused with file and line.

    test_prepare_data_writes_readable_indexed_data   text files -> documents + EOD, dirs walked
    test_same_bytes_as_megatron_preprocess_data      tiktoken / sentencepiece / null tokenizers
    test_jsonl_one_document_per_line                 key, sentence lists, blank lines, keys
    test_bad_jsonl_lines_name_file_and_line          not JSON, no key, wrong type, not UTF-8
    test_binary_files_refused_when_named_skipped_in_dirs   the real CLI: exit code, stderr
    test_no_temporary_files_left_on_error            <out>.tmp<pid>.* removed, old data kept
    test_bad_options_and_empty_inputs_are_refused    each option out of range, --out a dir,
                                                     an empty file, only empty documents: one
                                                     line, exit 2, nothing written
    test_dtype_follows_the_vocabulary                uint16 below 65500 ids, int32 above
    test_train_tokenizer_then_train_on_it            --train-tokenizer -> tokenizer.json, data,
                                                     and the trainer runs on the printed overrides
    test_progress_bar                                tqdm on --progress on
    test_workers_write_the_same_bytes                --workers 3 == --workers 1, byte for byte
    test_workers_bad_input                           0, negative, absurd counts: exit 2
    test_workers_report_the_bad_place                a bad line or id met in a worker names its
                                                     file and line; no temporary files left
    test_output_prefix_is_megatrons_naming           <prefix>_<key>_document, one of the two flags
    test_printed_overrides_survive_shell_and_hydra   a path with spaces and quotes, zsh's glob
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ufp4_megatron.cli.prepare_data import main as prepare_main
from ufp4_megatron.data.tokenizers import TokenizerConfig, build_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from _cli import run, train_cmd

DOCS = ["The first document.", ["A pre-split", " document", ""], "", "naïve ∑ the end\n"]


def _jsonl(path: Path, docs, key="text") -> Path:
    path.write_text("".join(json.dumps({key: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def _read(prefix):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(prefix))
    return ds, [list(map(int, ds[i])) for i in range(len(ds))]


def test_prepare_data_writes_readable_indexed_data(tmp_path, capsys):
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "docs" / "a.txt").write_text("hello")
    (tmp_path / "docs" / "sub" / "b.md").write_text("world!")
    (tmp_path / "docs" / "skip.bin").write_bytes(b"\0")  # not a text suffix: not read
    prepare_main([str(tmp_path / "docs"), "--out", str(tmp_path / "out")])
    _, seqs = _read(tmp_path / "out")
    assert seqs == [list(b"hello") + [256], list(b"world!") + [256]]
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (
        f"train with: 'data.prefixes=[{tmp_path / 'out'}]' "
        f"data.tokenizer.type=byte-level model.vocab_size=384"
    )
    assert "EOD id: 256 (appended to every document; vocabulary 258)" in out


def _megatron_preprocess(jsonl: Path, prefix: Path, args: SimpleNamespace) -> None:
    """tools/preprocess_data.py --append-eod (one partition, no sentence splitting), with the
    megatron-core pieces it calls: build_tokenizer(args); per JSON line, each sentence (the
    string, or each string of a list) tokenized, empty ones dropped, EOD appended to the last;
    IndexedDatasetBuilder(dtype=DType.optimal_dtype(vocab)).add_document per line; finalize."""
    from megatron.core.datasets import indexed_dataset
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer as mlm_build

    tok = mlm_build(args)
    builder = indexed_dataset.IndexedDatasetBuilder(
        f"{prefix}.bin", dtype=indexed_dataset.DType.optimal_dtype(tok.vocab_size)
    )
    for line in jsonl.read_text().splitlines():
        text = json.loads(line)["text"]
        doc, lens = [], []
        for sentence in text if isinstance(text, list) else [text]:
            ids = tok.tokenize(sentence)
            if ids:
                doc.extend(ids)
                lens.append(len(ids))
        if doc:
            doc.append(tok.eod)
            lens[-1] += 1
        builder.add_document(doc, lens)
    builder.finalize(f"{prefix}.idx")


def _mlm_args(**kw) -> SimpleNamespace:
    """Megatron-LM's tokenizer arguments (megatron/training TokenizerConfig) at their defaults."""
    base = dict(
        tokenizer_model=None,
        vocab_size=None,
        vocab_file=None,
        merge_file=None,
        special_tokens=None,
        chat_template=None,
        metadata_path=None,
        tiktoken_pattern=None,
        tiktoken_num_special_tokens=1000,
        tokenizer_sentencepiece_legacy=False,
        tokenizer_sentencepiece_ignore_extra_whitespaces=True,
        pad_vocab_size=False,
        null_tokenizer_eod_id=None,
        null_tokenizer_pad_id=-1,
    )
    return SimpleNamespace(**(base | kw))


def test_same_bytes_as_megatron_preprocess_data(
    tmp_path, tiktoken_ranks, sentencepiece_model, corpus_texts
):
    docs = DOCS + corpus_texts[:20]
    jsonl = _jsonl(tmp_path / "in.jsonl", docs)
    null_jsonl = _jsonl(tmp_path / "null.jsonl", ["5 7 9", "60000 1", ["3", "4 4"]])
    cases = {
        "tiktoken": (
            jsonl,
            _mlm_args(
                tokenizer_type="TikTokenizer", tokenizer_model=str(tiktoken_ranks), vocab_size=1266
            ),
            ["--tokenizer", "tiktoken", "--tokenizer-path", str(tiktoken_ranks)],
        ),
        "sentencepiece": (
            jsonl,
            _mlm_args(
                tokenizer_type="SentencePieceTokenizer", tokenizer_model=str(sentencepiece_model)
            ),
            ["--tokenizer", "sentencepiece", "--tokenizer-path", str(sentencepiece_model)],
        ),
        "null": (
            null_jsonl,
            _mlm_args(tokenizer_type="NullTokenizer", vocab_size=70000),
            ["--tokenizer", "null-text", "--vocab-size", "70000"],
        ),
    }
    for name, (src, args, flags) in cases.items():
        _megatron_preprocess(src, tmp_path / f"mlm_{name}", args)
        prepare_main(
            [str(src), "--out", str(tmp_path / f"ours_{name}"), "--json-keys", "text", *flags]
        )
        for ext in (".bin", ".idx"):
            theirs = (tmp_path / f"mlm_{name}{ext}").read_bytes()
            assert (tmp_path / f"ours_{name}{ext}").read_bytes() == theirs, (name, ext)
        ds, _ = _read(tmp_path / f"ours_{name}")
        assert len(ds.document_indices) == len(src.read_text().splitlines()) + 1, name
    assert _read(tmp_path / "ours_null")[1] == [
        [5, 7, 9, 69999],
        [60000, 1, 69999],
        [3],
        [4, 4, 69999],
    ]


def test_jsonl_one_document_per_line(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"body": "ab"}\n\n   \n{"body": ["c", "de"], "other": 1}\n')
    prepare_main(["--json-keys", "body", str(src), "--out", str(tmp_path / "o")])  # flag first
    ds, seqs = _read(tmp_path / "o")
    assert seqs == [[97, 98, 256], [99], [100, 101, 256]]  # a list's strings: one sequence each
    assert list(ds.document_indices) == [0, 1, 3]
    src.write_text('{"a": "x", "b": "yz"}\n{"a": "q", "b": "r"}\n')
    prepare_main([str(src), "--out", str(tmp_path / "m"), "--json-keys", "a,b"])
    assert _read(tmp_path / "m_a")[1] == [[120, 256], [113, 256]]
    assert _read(tmp_path / "m_b")[1] == [[121, 122, 256], [114, 256]]


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"text": "ok"}\n{"text": "no closing quote}\n', r"in\.jsonl:2: not JSON"),
        (b'{"text": "ok"}\n{"body": "x"}\n', r"in\.jsonl:2: no key 'text' \(keys: 'body'\)"),
        (b'{"text": 3}\n', r"in\.jsonl:1: 'text' is a int; expected a string"),
        (b'["text"]\n', r"in\.jsonl:1: a JSON list, not an object"),
        (b'{"text": "ok"}\n' * 600 + b'{"text": "\xff\xfe"}\n', r"in\.jsonl:601: not UTF-8"),
        (b'{"text": "ok"}\n{"text": "\xff\xfe"}\n', r"in\.jsonl: not UTF-8 text \(byte 25\)"),
    ],
)
def test_bad_jsonl_lines_name_file_and_line(tmp_path, content, message):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    with pytest.raises(SystemExit, match=message):
        prepare_main([str(src), "--out", str(tmp_path / "o")])


def test_binary_files_refused_when_named_skipped_in_dirs(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("text")
    (tmp_path / "d" / "b.txt").write_bytes(b"PK\x03\x04\0\0zip")  # a binary with a text name
    (tmp_path / "d" / "c.txt").write_bytes("café".encode("latin-1") + b" more")
    cmd = [sys.executable, "-m", "ufp4_megatron.cli.prepare_data", "--out", str(tmp_path / "o")]
    r = run(cmd + [str(tmp_path / "d" / "b.txt")], tmp_path)  # the real CLI: status, stderr
    assert r.returncode == 2 and not (tmp_path / "o.bin").exists()
    assert r.stderr.strip().splitlines() == [
        f"prepare_data: error: {tmp_path / 'd' / 'b.txt'}: binary (a NUL byte in its first 8 "
        f"KiB); give text (UTF-8) or JSONL files"
    ]
    with pytest.raises(SystemExit, match=r"c\.txt: not UTF-8 text \(byte 3\)"):
        prepare_main([str(tmp_path / "d" / "c.txt"), "--out", str(tmp_path / "o")])
    prepare_main([str(tmp_path / "d"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert f"skipping {tmp_path / 'd' / 'b.txt'}: binary" in err
    assert f"skipping {tmp_path / 'd' / 'c.txt'}: not UTF-8" in err
    assert _read(tmp_path / "o")[1] == [list(b"text") + [256]]


def test_no_temporary_files_left_on_error(tmp_path):
    src = tmp_path / "in.jsonl"
    prepare_main([str(_jsonl(src, ["old data"])), "--out", str(tmp_path / "o")])
    before = (tmp_path / "o.bin").read_bytes()
    src.write_text('{"text": "a"}\n' * 1000 + "oops\n")
    with pytest.raises(SystemExit, match=r"in\.jsonl:1001: not JSON"):
        prepare_main([str(src), "--out", str(tmp_path / "o")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "o.bin", "o.idx"]
    assert (tmp_path / "o.bin").read_bytes() == before  # the previous data is intact
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no documents to write"):
        prepare_main([str(tmp_path / "empty"), "--out", str(tmp_path / "e")])
    assert not list(tmp_path.glob("e.*"))


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--tokenizer", "null-text", "--vocab-size", "300", "--eod-id", "-5"],
            "--eod-id -5: must be an integer in [0, 2**31)",
        ),
        (["--tokenizer", "null-text", "--vocab-size", "0"], "--vocab-size 0: must be an integer"),
        (
            ["--tokenizer", "null-text", "--vocab-size", "300", "--eod-id", "300"],
            "--eod-id 300 is outside the ids 0..299 of --vocab-size 300",
        ),
        (["--tiktoken-num-special-tokens", "-1"], "--tiktoken-num-special-tokens -1: must be"),
        (["--train-tokenizer", "100"], "--train-tokenizer 100: must be an integer in [257, 2**31)"),
        (["--max-bytes", "0"], "--max-bytes 0: must be an integer in [1, 2**31)"),
        (["--out", "DIR"], "--out '{tmp}': give a file prefix (writes <prefix>.bin"),
        (["--out", "{tmp}/sub/"], "--out '{tmp}/sub/': give a file prefix"),
        (["--out", " "], "--out ' ': give a file prefix"),
        (["EMPTY"], "empty.txt: empty (0 bytes); give text (UTF-8) or JSONL files"),
        (["BLANK"], "no text to write to {tmp}/o: all 1 documents are empty; give files that hold"),
        (["EMPTY_JSONL"], "no text to write to {tmp}/o: all 2 documents are empty"),
    ],
)
def test_bad_options_and_empty_inputs_are_refused(tmp_path, capsys, argv, message):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("")
    (tmp_path / "blank_dir").mkdir()
    (tmp_path / "blank_dir" / "blank.txt").write_text("")  # found in a dir: not refused alone
    _jsonl(tmp_path / "e.jsonl", ["", ""])
    inputs = {
        "EMPTY": str(tmp_path / "empty.txt"),
        "BLANK": str(tmp_path / "blank_dir"),
        "EMPTY_JSONL": str(tmp_path / "e.jsonl"),
        "DIR": str(tmp_path),
    }
    argv = [inputs.get(a, a).replace("{tmp}", str(tmp_path)) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "o")]
    if not any(a in inputs.values() for a in argv):
        argv.insert(0, str(tmp_path / "e.jsonl"))  # a valid input; the option is the problem
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(SystemExit) as e:
        prepare_main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"prepare_data: error: {str(e.value).split('error: ', 1)[1]}"]
    assert message.replace("{tmp}", str(tmp_path)) in err[0], err[0]
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_dtype_follows_the_vocabulary(tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", ["1 2 65498"])
    for vocab, dtype in ((65499, np.uint16), (65500, np.int32)):  # Megatron's optimal_dtype
        prepare_main(
            [
                str(src),
                "--out",
                str(tmp_path / f"v{vocab}"),
                "--tokenizer",
                "null-text",
                "--vocab-size",
                str(vocab),
            ]
        )
        ds, seqs = _read(tmp_path / f"v{vocab}")
        assert ds.index.dtype == dtype and seqs == [[1, 2, 65498, vocab - 1]]
    _jsonl(src, ["1 2", "3 70000"])  # ids past the vocabulary would wrap around in uint16
    with pytest.raises(
        SystemExit,
        match=r"in\.jsonl:2: token id 70000 is outside the "
        r"tokenizer's ids 0\.\.65498",
    ):
        prepare_main(
            [
                str(src),
                "--out",
                str(tmp_path / "bad"),
                "--tokenizer",
                "null-text",
                "--vocab-size",
                "65499",
            ]
        )


def test_train_tokenizer_then_train_on_it(tmp_path, corpus_texts):
    src = _jsonl(tmp_path / "mine.jsonl", corpus_texts[:30])
    r = run(
        [
            sys.executable,
            "-m",
            "ufp4_megatron.cli.prepare_data",
            str(src),
            "--out",
            str(tmp_path / "mine"),
            "--train-tokenizer",
            "1000",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    tok_path = tmp_path / "mine.tokenizer.json"
    overrides = shlex.split(r.stdout.strip().splitlines()[-1].removeprefix("train with: "))
    assert overrides == [
        f"data.prefixes=[{tmp_path / 'mine'}]",
        "data.tokenizer.type=huggingface",
        f"data.tokenizer.path={tok_path}",
        "model.vocab_size=1024",
    ]
    tok = build_tokenizer(TokenizerConfig(type="huggingface", path=str(tok_path)))
    _, seqs = _read(tmp_path / "mine")
    assert seqs[0] == tok.tokenize(corpus_texts[0]) + [0] and tok.vocab_size == 1000
    r = run(
        train_cmd(
            tmp_path / "run",
            tmp_path / "cache",
            "train.steps=2",
            "precision=bf16",
            "logging.wandb.mode=disabled",
            "checkpoint.save_at_end=false",
            "data.split='50,50,0'",
            *overrides,
        ),
        tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert abs(first["loss"] - np.log(1024)) < 0.5  # a fresh model over the 1024-row vocabulary


def test_progress_bar(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl", ["x" * 100] * 50)
    prepare_main([str(src), "--out", str(tmp_path / "o"), "--progress", "on"])
    assert "tokenizing: 100%" in capsys.readouterr().err
    prepare_main([str(src), "--out", str(tmp_path / "o")])  # auto: small inputs show none
    assert "tokenizing" not in capsys.readouterr().err


def _many_docs(path: Path, n: int = 300) -> Path:
    docs = [f"document {i}: " + "word " * (i % 37) + "∑ naïve" * (i % 3) for i in range(n)]
    if n > 8:
        docs[7] = ["pre-split", " sentences", ""]
        docs[8] = ""  # an empty document
    path.write_text(
        "".join(json.dumps({"text": d, "title": f"t{i}"}) + "\n" for i, d in enumerate(docs))
    )
    return path


def test_workers_write_the_same_bytes(tmp_path, bpe_json):
    src = _many_docs(tmp_path / "in.jsonl")
    for workers in ("1", "3"):
        prepare_main(
            [
                str(src),
                "--output-prefix",
                str(tmp_path / f"w{workers}"),
                "--json-keys",
                "text,title",
                "--tokenizer",
                "huggingface",
                "--tokenizer-path",
                str(bpe_json),
                "--workers",
                workers,
            ]
        )
    for key in ("text", "title"):
        for ext in (".bin", ".idx"):
            one, three = (tmp_path / f"w{w}_{key}_document{ext}" for w in ("1", "3"))
            assert one.read_bytes() == three.read_bytes(), (key, ext)
    assert len(_read(tmp_path / "w3_text_document")[1]) == 300


@pytest.mark.parametrize("workers", ["0", "-2", "100000"])
def test_workers_bad_input(tmp_path, capsys, workers):
    src = _many_docs(tmp_path / "in.jsonl", 5)
    with pytest.raises(SystemExit) as e:
        prepare_main([str(src), "--out", str(tmp_path / "o"), "--workers", workers])
    assert e.value.code == 2
    assert f"--workers {workers}: give 1 to " in capsys.readouterr().err
    assert not list(tmp_path.glob("o*"))


def test_workers_report_the_bad_place(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "1 2"}\n' * 200 + '{"text": "3 70000"}\n' + '{"text": "1"}\n' * 50)
    with pytest.raises(SystemExit, match=r"in\.jsonl:201: token id 70000 is outside"):
        prepare_main(
            [
                str(src),
                "--out",
                str(tmp_path / "o"),
                "--tokenizer",
                "null-text",
                "--vocab-size",
                "1000",
                "--workers",
                "2",
            ]
        )
    src.write_text('{"text": "a"}\n' * 100 + "oops\n")
    with pytest.raises(SystemExit, match=r"in\.jsonl:101: not JSON"):
        prepare_main([str(src), "--out", str(tmp_path / "o"), "--workers", "2"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no temporary files


def test_output_prefix_is_megatrons_naming(tmp_path, capsys):
    src = _many_docs(tmp_path / "in.jsonl", 3)
    prepare_main([str(src), "--output-prefix", str(tmp_path / "web")])
    assert sorted(p.name for p in tmp_path.glob("web*")) == [
        "web_text_document.bin",
        "web_text_document.idx",
    ]
    assert f"data.prefixes=[{tmp_path / 'web_text_document'}]" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # one naming or the other, not both
        prepare_main([str(src), "--out", str(tmp_path / "a"), "--output-prefix", "b"])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_printed_overrides_survive_shell_and_hydra(tmp_path, capsys, bpe_json):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    src = _many_docs(tmp_path / "in.jsonl", 3)
    odd = tmp_path / 'my data\'s "dir"' / "web"  # a space, both quotes
    tok = tmp_path / "tok dir" / "tokenizer.json"
    tok.parent.mkdir()
    tok.write_bytes(Path(bpe_json).read_bytes())
    prepare_main(
        [
            str(src),
            "--output-prefix",
            str(odd),
            "--tokenizer",
            "huggingface",
            "--tokenizer-path",
            str(tok),
        ]
    )
    line = capsys.readouterr().out.strip().splitlines()[-1].removeprefix("train with: ")
    words = shlex.split(line)  # what a POSIX shell (zsh too: every glob character is quoted)
    assert line.startswith("'data.prefixes=[")  # zsh globs an unquoted [...]
    parsed = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(words)}
    assert parsed["data.prefixes"] == [f"{odd}_text_document"]
    assert parsed["data.tokenizer.path"] == str(tok)
    assert parsed["data.tokenizer.type"] == "huggingface"

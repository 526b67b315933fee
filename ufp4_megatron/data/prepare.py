"""Text or JSONL files -> Megatron indexed data (.bin/.idx), with any offline tokenizer.

    python -m ufp4_megatron.cli.prepare_data --out data/mytext file1.txt dir2/ ...   # bytes
    python -m ufp4_megatron.cli.prepare_data --out data/web --json-keys text web.jsonl \\
        --tokenizer huggingface --tokenizer-path tok/tokenizer.json
    python -m ufp4_megatron.cli.prepare_data --out data/web --train-tokenizer 8192 web.jsonl
    python -m ufp4_megatron.cli.prepare_data --out data/stdlib           # the embedded corpus
    python -m ufp4_megatron.cli.prepare_data --output-prefix data/web --workers 8 web.jsonl
                                                    # data/web_text_document.bin/.idx, 8 workers

A text file is one document; a .jsonl/.json file one document per line (the string under
--json-keys, as Megatron-LM's tools/preprocess_data.py --append-eod reads it); EOD ends each
document. Directories are walked for *.txt, *.md, *.rst, *.py, *.jsonl, *.json in sorted
order. --train-tokenizer N first trains a byte-level BPE of N tokens on the inputs and saves
it as <out>.tokenizer.json (<prefix>.tokenizer.json). --out names the files exactly
(<out>.bin/.idx); --output-prefix names them as Megatron-LM's preprocess_data.py does
(<prefix>_<key>_document.bin/.idx, e.g. data/web_text_document). --workers N tokenizes in N
processes (input read and output written in this one, in input order: the files are byte for
byte those of one worker). The EOD id appended to each document is printed; the last line is
the trainer's overrides for this data, quoted for the shell (zsh would read
`data.prefixes=[...]` as a glob).
Bad input (an option out of range, an empty input, a file that is not text) ends with one
line `prepare_data: error: ...` and exit status 2, and writes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import re
import shlex
import sys
from pathlib import Path

from .bpe import MIN_VOCAB
from .corpus import stdlib_documents
from .indexed import IndexedWriter, encode
from .sources import collect, read_documents
from .tokenizers import TOKENIZER_TYPES, TokenizerConfig, build_tokenizer

PROGRESS_MIN_BYTES = 16 << 20  # --progress auto: a bar from this much input on
MAX_WORKERS_PER_CPU = 4  # --workers beyond this many per CPU is a typo, not a plan


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ufp4-prepare-data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "inputs", nargs="*", help="text/JSONL files or directories; none: the embedded corpus"
    )
    out = ap.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", help="output prefix (writes <out>.bin and <out>.idx)")
    out.add_argument(
        "--output-prefix",
        metavar="PREFIX",
        help="Megatron-LM's naming: writes <PREFIX>_<key>_document.bin/.idx "
        "(e.g. data/web_text_document)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="tokenizing processes (default 1); the output is the same for any N",
    )
    ap.add_argument(
        "--json-keys",
        default="text",
        metavar="KEY[,KEY...]",
        help="JSONL key(s) holding the text (default: text); several keys, comma-"
        "separated, write <out>_<key>.bin/.idx each",
    )
    tok = ap.add_argument_group("tokenizer (the same choices as the trainer's data.tokenizer)")
    tok.add_argument("--tokenizer", choices=TOKENIZER_TYPES, default="byte-level")
    tok.add_argument(
        "--tokenizer-path",
        help="tokenizer.json (or its dir), tiktoken ranks .json, or sentencepiece .model",
    )
    tok.add_argument("--vocab-size", type=int, help="null-text: the ids' range; tiktoken: its size")
    tok.add_argument("--eod-id", type=int, help="null-text / huggingface: the EOD id")
    tok.add_argument("--tiktoken-pattern", default="v2", choices=("v1", "v2"))
    tok.add_argument("--tiktoken-num-special-tokens", type=int, default=1000)
    tok.add_argument(
        "--train-tokenizer",
        type=int,
        metavar="N",
        help="train a byte-level BPE of N tokens on the inputs first, save it as "
        "<out>.tokenizer.json and tokenize with it",
    )
    ap.add_argument("--max-bytes", type=int, default=8_000_000, help="embedded corpus size")
    ap.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help=f"a tqdm bar (auto: from {PROGRESS_MIN_BYTES >> 20} MiB of input)",
    )
    return ap


class Refused(SystemExit):
    """Exit status 2 after one line on stderr; str() is that line."""

    def __init__(self, line: str):
        super().__init__(2)
        self.line = line

    def __str__(self) -> str:
        return self.line


def main(argv: list[str] | None = None) -> None:
    import warnings

    args = _parser().parse_args(argv)
    # megatron.core warns at import about apex/TE/absl, which tokenizing never uses
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine|apex|absl).*")
    try:
        check_args(args)
        _prepare(args)
    except (ValueError, OSError) as e:  # bad input: one line naming what to change
        line = f"prepare_data: error: {' '.join(str(e).split())}"
        print(line, file=sys.stderr, flush=True)
        raise Refused(line) from None


def check_args(args) -> None:
    """The numeric options in range, --out a file prefix (ValueError, one line)."""
    at_least = {
        "--vocab-size": (args.vocab_size, 1),
        "--eod-id": (args.eod_id, 0),
        "--tiktoken-num-special-tokens": (args.tiktoken_num_special_tokens, 0),
        "--train-tokenizer": (args.train_tokenizer, MIN_VOCAB),
        "--max-bytes": (args.max_bytes, 1),
    }
    for flag, (value, lo) in at_least.items():
        if value is not None and not lo <= value < 2**31:
            raise ValueError(f"{flag} {value}: must be an integer in [{lo}, 2**31)")
    if args.vocab_size is not None and args.eod_id is not None and args.eod_id >= args.vocab_size:
        raise ValueError(
            f"--eod-id {args.eod_id} is outside the ids 0..{args.vocab_size - 1} "
            f"of --vocab-size {args.vocab_size}"
        )
    cpus = os.cpu_count() or 1
    if not 1 <= args.workers <= MAX_WORKERS_PER_CPU * cpus:
        raise ValueError(
            f"--workers {args.workers}: give 1 to {MAX_WORKERS_PER_CPU * cpus} "
            f"(this machine has {cpus} CPUs)"
        )
    flag, out = (
        ("--out", str(args.out))
        if args.output_prefix is None
        else ("--output-prefix", str(args.output_prefix))
    )
    if not out.strip() or out.endswith(("/", os.sep)) or Path(out).is_dir():
        raise ValueError(
            f"{flag} {out!r}: give a file prefix (writes <prefix>.bin and "
            f"<prefix>.idx), e.g. {flag} {out.rstrip('/') or 'data'}/mytext"
        )


def _prepare(args) -> None:
    from tqdm import tqdm

    files = collect(args.inputs) if args.inputs else None
    cfg = TokenizerConfig(
        type=args.tokenizer,
        path=args.tokenizer_path,
        vocab_size=args.vocab_size,
        eod_id=args.eod_id,
        tiktoken_pattern=args.tiktoken_pattern,
        tiktoken_num_special_tokens=args.tiktoken_num_special_tokens,
    )
    keys = [k for k in args.json_keys.split(",") if k]
    if not keys or (files is None and len(keys) > 1):
        raise ValueError(
            f"--json-keys {args.json_keys!r}: give one key, or several for JSONL inputs"
        )
    if args.train_tokenizer is not None:
        cfg = _train_tokenizer(args, files, keys)
    tokenizer = build_tokenizer(cfg, key="--tokenizer")
    total = sum(f.stat().st_size for f in files) if files else args.max_bytes
    show = args.progress == "on" or (args.progress == "auto" and total >= PROGRESS_MIN_BYTES)
    outs = _outputs(args, keys)
    print(
        f"EOD id: {tokenizer.eod} (appended to every document; vocabulary {tokenizer.vocab_size})",
        flush=True,
    )
    with (
        contextlib.ExitStack() as stack,
        tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            desc="tokenizing",
            disable=not show,
            file=sys.stderr,
        ) as bar,
    ):
        writers = {k: stack.enter_context(IndexedWriter(p, tokenizer)) for k, p in outs.items()}
        if files is None:
            docs = (
                ("embedded corpus", {keys[0]: [t]})
                for t in _counted(stdlib_documents(args.max_bytes), bar)
            )
        else:
            docs = read_documents(files, keys, bar.update)
        for where, encoded in _encoded(docs, tokenizer, cfg, args.workers, stack):
            for k, (ids, lengths) in encoded.items():
                try:
                    writers[k].add_encoded(ids, lengths)
                except ValueError as e:
                    raise ValueError(f"{where}: {e}") from e
    for w in writers.values():
        print(f"wrote {w.prefix}.bin/.idx: {w.documents} documents, {w.tokens} tokens")
    prefixes = ",".join(_hydra_item(str(p)) for p in outs.values())
    overrides = [f"data.prefixes=[{prefixes}]", *_overrides(cfg, tokenizer.vocab_size)]
    print(f"train with: {' '.join(shlex.quote(o) for o in overrides)}")


def _outputs(args, keys: list[str]) -> dict[str, Path]:
    """Output prefix per JSON key: --out as given (with _<key> for several keys), or
    Megatron-LM's <prefix>_<key>_document."""
    if args.output_prefix is not None:
        return {k: Path(f"{args.output_prefix}_{k}_document") for k in keys}
    return {k: Path(args.out if len(keys) == 1 else f"{args.out}_{k}") for k in keys}


# a path Hydra's override grammar reads as it is, unquoted; anything else is quoted for it
_HYDRA_PLAIN = re.compile(r"[A-Za-z0-9_./+-]+")


def _hydra_item(value: str) -> str:
    if _HYDRA_PLAIN.fullmatch(value):
        return value
    # Hydra's quoted strings: a run of backslashes is escaped only before a quote or the end
    escaped = re.sub(r'(\\+)(?="|$)', lambda m: m.group(1) * 2, value)
    return '"' + escaped.replace('"', '\\"') + '"'


_worker_tokenizer = None


def _init_worker(cfg: TokenizerConfig) -> None:
    global _worker_tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per worker is the parallelism
    _worker_tokenizer = build_tokenizer(cfg, key="--tokenizer")


def _encode_in_worker(item):
    where, doc = item
    try:
        return where, {k: encode(_worker_tokenizer, s) for k, s in doc.items()}, None
    except ValueError as e:  # said by the main process with the document's place
        return where, None, str(e)


def _encoded(docs, tokenizer, cfg: TokenizerConfig, workers: int, stack):
    """(where, {key: (ids, lengths)}) per document, in input order: here with one worker,
    else by a pool of `workers` processes (Pool.imap keeps the order)."""
    if workers == 1:
        for where, doc in docs:
            try:
                yield where, {k: encode(tokenizer, s) for k, s in doc.items()}
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from e
        return
    pool = stack.enter_context(
        multiprocessing.get_context("fork").Pool(workers, initializer=_init_worker, initargs=(cfg,))
    )
    for where, encoded, error in pool.imap(_encode_in_worker, docs, chunksize=16):
        if error is not None:
            raise ValueError(f"{where}: {error}")
        yield where, encoded


def _train_tokenizer(args, files, keys) -> TokenizerConfig:
    from .bpe import train_bpe

    if args.tokenizer != "byte-level" or args.tokenizer_path:
        raise ValueError(
            "--train-tokenizer makes its own tokenizer: drop --tokenizer and --tokenizer-path"
        )
    if files is None:
        texts = stdlib_documents(args.max_bytes)
    else:
        texts = (s for _, doc in read_documents(files, keys) for ss in doc.values() for s in ss)
    path = train_bpe(
        texts,
        args.train_tokenizer,
        f"{args.out or args.output_prefix}.tokenizer.json",
        progress=args.progress == "on",
    )
    print(f"trained a byte-level BPE of {args.train_tokenizer} tokens: {path}")
    return TokenizerConfig(type="huggingface", path=str(path))


def _counted(texts, bar):
    for text in texts:
        bar.update(len(text.encode("utf-8")))
        yield text


def _overrides(cfg: TokenizerConfig, vocab_size: int) -> list[str]:
    out = [f"data.tokenizer.type={cfg.type}"]
    default = TokenizerConfig()
    for field in (
        "path",
        "vocab_size",
        "eod_id",
        "tiktoken_pattern",
        "tiktoken_num_special_tokens",
    ):
        if getattr(cfg, field) != getattr(default, field):
            value = getattr(cfg, field)
            out.append(f"data.tokenizer.{field}={_hydra_item(str(value))}")
    padded = -(-vocab_size // 128) * 128
    out.append(f"model.vocab_size={padded}")
    return out

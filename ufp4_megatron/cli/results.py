"""`python -m ufp4_megatron.cli.results`: every table of docs/results.md, recomputed on a CPU
from the committed archives' per-step losses (report/results_doc.py; about 10 s).

    python -m ufp4_megatron.cli.results            print every table
    python -m ufp4_megatron.cli.results --check    exit 1 if a table of the doc differs
    python -m ufp4_megatron.cli.results --write    rewrite the doc's tables in place

Exit status: 0 done (or the doc agrees), 1 the doc's tables differ (--check), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..report.errors import BadInput


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ufp4_megatron.cli.results",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--archives",
        type=Path,
        default=Path("docs/results"),
        help="the folder of the study folders (prereg/, study-pysrc/, ...)",
    )
    ap.add_argument("--doc", type=Path, default=Path("docs/results.md"))
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare the doc's tables")
    mode.add_argument("--write", action="store_true", help="rewrite the doc's tables")
    args = ap.parse_args(argv)

    from ..report import results_doc

    if not args.archives.is_dir():
        print(
            f"error: --archives {args.archives}: no such folder (run from the repository "
            f"root, or pass --archives)",
            file=sys.stderr,
        )
        return 2
    if (args.check or args.write) and not args.doc.is_file():
        print(f"error: --doc {args.doc}: no such file", file=sys.stderr)
        return 2
    try:
        if args.check:
            problems = results_doc.check(args.doc, args.archives)
            for p in problems:
                print(f"{args.doc}: {p}", file=sys.stderr)
            if problems:
                print(
                    f"run `python -m ufp4_megatron.cli.results --write` to update "
                    f"{args.doc}'s tables",
                    file=sys.stderr,
                )
                return 1
            print(f"{args.doc}: every table agrees with {args.archives}")
        elif args.write:
            changed = results_doc.write(args.doc, args.archives)
            print(
                f"{args.doc}: {len(changed)} tables rewritten"
                + (f" ({', '.join(changed)})" if changed else "")
            )
        else:
            for name, text in results_doc.tables(args.archives).items():
                print(f"## {name}\n\n{text}")
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

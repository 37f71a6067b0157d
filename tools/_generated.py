"""The command line every generator in tools/ shares: write the generated file, or with
``--check`` exit 1 when the checked-in copy differs from what the generator makes now."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(path: Path, render, description: str, argv=None) -> int:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true", help="exit 1 when the checked-in file is stale")
    args = ap.parse_args(argv)
    text = render()
    rel = path.relative_to(ROOT)
    if args.check:
        if not path.exists() or path.read_text() != text:
            print(f"{rel} is stale: run python {Path(sys.argv[0]).as_posix()}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {rel} ({text.count(chr(10))} lines)")
    return 0

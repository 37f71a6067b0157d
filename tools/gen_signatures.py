"""Regenerate cudnn_compat/_core/signatures.py: every cuDNN function's C parameters (name, kind),
parsed from the real headers, for the argument-conversion layer of ``_core.registry.legacy``.

    python tools/gen_signatures.py [--check] [--v9 DIR] [--v8 DIR]

Headers: cuDNN 9 first (``pip download --no-deps nvidia-cudnn-cu12``, unzip, nvidia/cudnn/include),
then cuDNN 8.9 for what 9 removed (``nvidia-cudnn-cu12==8.9.*``), then tools/cudnn7_removed.h for
the six functions 8.0 removed.  Without --v9/--v8 the directories come from $CUDNN_HEADERS_V9 /
$CUDNN_HEADERS_V8, else /tmp/cudnn_headers/v9 and /v8.  ``--check`` exits 1 when the checked-in
table differs from what the headers give.

Kinds (a closed set; _registry.KIND_RULES says what each accepts):
  int, int64, uint32, uint64, size_t, double, float  by-value numbers (int = C int / int32_t)
  enum:<type>                                       a cuDNN enum (or libraryPropertyType) by value
  int[], uint32[]                                   a const host array of ints (dims, pads, axes...)
  handle, desc:<type>, desc[]:<type>                cudnnHandle_t, a descriptor, an array of them
  pointer                                           data / host / device pointers, alpha, beta, void*
  opaque                                            streams, callbacks, structs passed by value
  out                                               an out-parameter (non-const pointer): the Python
                                                    function returns it instead of taking it
"""
from __future__ import annotations

import argparse
import os
import pathlib
import pprint
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "cudnn_compat" / "_core" / "signatures.py"
V7_REMOVED = ROOT / "tools" / "cudnn7_removed.h"
DEFAULT_V9 = pathlib.Path(os.environ.get("CUDNN_HEADERS_V9", "/tmp/cudnn_headers/v9"))
DEFAULT_V8 = pathlib.Path(os.environ.get("CUDNN_HEADERS_V8", "/tmp/cudnn_headers/v8"))

INT_TYPES = {"int": "int", "int32_t": "int", "int64_t": "int64", "long long": "int64", "long long int": "int64",
             "unsigned": "uint32", "unsigned int": "uint32", "uint32_t": "uint32",
             "unsigned long long": "uint64", "uint64_t": "uint64", "size_t": "size_t",
             "double": "double", "float": "float"}
EXTRA_ENUMS = {"libraryPropertyType"}  # library_types.h, not a cuDNN header
OPAQUE = {"cudaStream_t", "cudnnCallback_t", "cudnnAlgorithm_t", "char"}

# Parameters whose C declaration is an int array but whose implementation reads it as data:
# any host buffer (a sequence, a NumPy/CuPy array or a pointer int), so they pass through.
DATA_ARRAYS = {
    ("cudnnCTCLoss", "hostLabels"), ("cudnnCTCLoss", "hostLabelLengths"), ("cudnnCTCLoss", "hostInputLengths"),
    ("cudnnCTCLoss_v8", "labels"), ("cudnnCTCLoss_v8", "labelLengths"), ("cudnnCTCLoss_v8", "inputLengths"),
    ("cudnnGetCTCLossWorkspace", "labels"),
    ("cudnnGetCTCLossWorkspaceSize", "labels"), ("cudnnGetCTCLossWorkspaceSize", "labelLengths"),
    ("cudnnGetCTCLossWorkspaceSize", "inputLengths"),
    ("cudnnMultiHeadAttnForward", "loWinIdx"), ("cudnnMultiHeadAttnForward", "hiWinIdx"),
    ("cudnnMultiHeadAttnBackwardData", "loWinIdx"), ("cudnnMultiHeadAttnBackwardData", "hiWinIdx"),
    ("cudnnSetSeqDataDescriptor", "seqLengthArray"),
}

# Names a family may register that no header declares, with the C function whose parameters they
# share (none today: CuPy 13's suffixed spellings are aliases of the registered wrappers).
ALIASES: dict = {}

PROTO = re.compile(r"\b(?:cudnnStatus_t|size_t|const\s+char\s*\*)\s*(cudnn\w+)\s*\(([^()]*)\)\s*;")
ENUM = re.compile(r"typedef\s+enum\s*\w*\s*\{[^}]*\}\s*(\w+)\s*;")
STRIP = re.compile(r"\b(CUDNN_DEPRECATED(?:_ENUM)?|CUDNNWINAPI|CUDNN_DEPRECATED_ENUM)\b")


def clean(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^\s*#[^\n]*", " ", text, flags=re.M)
    return STRIP.sub(" ", text)


def kind_of(fn: str, name: str, ctype: str, ptr: int, const: bool, enums: set) -> str:
    base = " ".join(ctype.split())
    if ptr == 0:
        if base in INT_TYPES:
            return INT_TYPES[base]
        if base in enums:
            return f"enum:{base}"
        if base == "cudnnHandle_t":
            return "handle"
        if base.endswith("_t") and base.startswith("cudnn") and base not in OPAQUE:
            return f"desc:{base}"  # descriptors, plans, param packs, algorithm performances
        return "opaque"
    if base == "void":
        return "pointer" if ptr == 1 else "out"
    if not const:
        return "out"
    if (fn, name) in DATA_ARRAYS or (name.startswith("dev") and ptr == 1):
        return "pointer"
    if ptr == 1 and base in INT_TYPES and INT_TYPES[base] in ("int", "uint32"):
        return INT_TYPES[base] + "[]"
    if ptr == 1 and base in enums:
        return "int[]"
    if ptr == 1 and base.startswith("cudnn") and base.endswith("_t") and base != "cudnnHandle_t":
        return f"desc[]:{base}"
    return "pointer"


def parse_params(fn: str, text: str, enums: set) -> tuple:
    text = " ".join(text.split())
    if text in ("", "void"):
        return ()
    out = []
    for raw in text.split(","):
        m = re.match(r"^(?P<decl>.*?)\b(?P<name>\w+)\s*(?P<arr>\[\s*\w*\s*\])?$", raw.strip())
        if not m or not m.group("decl").strip():
            raise SystemExit(f"{fn}: cannot parse parameter {raw!r}")
        decl = m.group("decl")
        ptr = decl.count("*") + (1 if m.group("arr") else 0)
        const = bool(re.search(r"\bconst\b", decl.split("*")[0])) if ptr else False
        ctype = " ".join(re.sub(r"\bconst\b|\*", " ", decl).split())
        out.append((m.group("name"), kind_of(fn, m.group("name"), ctype, ptr, const, enums)))
    return tuple(out)


def header_files(directory: pathlib.Path) -> list:
    """The headers of one release, without the _v8/_v9 duplicates."""
    return sorted(p for p in directory.glob("cudnn*.h") if not re.search(r"_v\d+\.h$", p.name))


def collect(v9: pathlib.Path, v8: pathlib.Path) -> tuple:
    """(signatures, sources): C name -> params and C name -> header it came from."""
    layers = [("9", header_files(v9)), ("8", header_files(v8)), ("7", [V7_REMOVED])]
    if not layers[0][1] or not layers[1][1]:
        raise FileNotFoundError(f"cuDNN headers not found in {v9} and {v8}")
    texts = [(ver, p, clean(p.read_text())) for ver, files in layers for p in files]
    enums = set(EXTRA_ENUMS)
    for _, _, t in texts:
        enums.update(ENUM.findall(t))
    sigs, sources = {}, {}
    for ver, path, t in texts:
        for m in PROTO.finditer(t):
            fn = m.group(1)
            if fn in sigs:
                continue  # the newest release that declares it wins
            sigs[fn] = parse_params(fn, m.group(2), enums)
            sources[fn] = f"cuDNN {ver} {path.name}"
    for alias, base in ALIASES.items():
        if alias not in sigs and base in sigs:
            sigs[alias], sources[alias] = sigs[base], f"alias of {base}"
    return sigs, sources


def render(sigs: dict, sources: dict) -> str:
    lines = ['"""Generated by tools/gen_signatures.py from the cuDNN 9.x, 8.9 and 7.6 headers; do not edit.',
             "",
             "SIGNATURES: C function name -> tuple of (C parameter name, kind), in C order, out-parameters",
             "included (kind 'out').  Kinds are documented in tools/gen_signatures.py and _core/registry.py.",
             "SOURCES: C function name -> the header that declared it.",
             '"""', "", "SIGNATURES = {"]
    for fn in sorted(sigs):
        lines.append(f"    {fn!r}: {sigs[fn]!r},")
    lines.append("}")
    lines.append("")
    lines.append("SOURCES = " + pprint.pformat(dict(sorted(sources.items())), width=110, sort_dicts=False))
    lines.append("")
    return "\n".join(lines)


def generate(v9: pathlib.Path = DEFAULT_V9, v8: pathlib.Path = DEFAULT_V8) -> str:
    return render(*collect(v9, v8))


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--v9", type=pathlib.Path, default=DEFAULT_V9)
    ap.add_argument("--v8", type=pathlib.Path, default=DEFAULT_V8)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    text = generate(a.v9, a.v8)
    if a.check:
        same = OUT.exists() and OUT.read_text() == text
        print("in sync" if same else f"{OUT} differs from the headers; run tools/gen_signatures.py")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

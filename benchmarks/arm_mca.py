"""Predicted speed of the ARM micro-kernels on cores we cannot run here (README: "Supported CPUs
and systems"): each micro-kernel's inner loop, cut out of the object code of the NEON kernel
files compiled for aarch64, through llvm-mca's models of CPUS; the figure: the loop's count of
its work instruction (KERNELS) over the pipes the model issues it to (PROBE), over the predicted
cycles (few-row kernels: the bytes of B an iteration reads, FEW_BYTES, a cycle). A model, not a
measurement. Needs llvm-mca and llvm-objdump (Debian's llvm-19) and an aarch64 compiler.

    python benchmarks/arm_mca.py [--cc aarch64-linux-gnu-gcc] [--cc "clang-19 --target=aarch64-linux-gnu"]
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPUS = ["neoverse-v2", "neoverse-n1", "apple-m4"]
SOURCES = ("rd_neon.c", "rd_neon_dot.c", "rd_neon_few.c", "rd_neon_w4a8.c")
# kernel symbol: (its 12-row body's symbol, which a compiler may keep out of line, and the
# instruction whose rate bounds it)
KERNELS = {
    **{f"rd_sgemm_neon{w}_12x8": (f"s{b}_rows12", "fmla") for w, b in (
        ("", ""), ("_bf16w", "b"), ("_f16w", "h"), ("_i8w", "i8"), ("_f8w", "f8"), ("_f4w", "f4"))},
    "rd_dgemm_neon_6x8": (None, "fmla.2d"), "rd_bf16mmla_neon_12x8": ("bfm_rows12", "bfmmla"),
    "rd_u8s8mmla_neon_12x8": ("usm_rows12", "usmmla"), "rd_u8s8dot_neon_dot_12x8": ("ss_rows12", "udot"),
    # the few-row kernels (rd_neon_few.c): one row over 8 panels or two over 4 (16 fmla an
    # iteration either way; B bytes an iteration: FEW_BYTES)
    **{f"rd_few_neon_{t}": (f"rd_few_neon_{t}_plain", "fmla") for t in ("f32", "bf16w", "i8w", "f8w", "f4w", "i4w")},
    # w4a8 (rd_neon_w4a8.c): 4-bit weights decoded by tbl into sdot; the few-row loop of one
    # row over 4 panels (8 sdot an iteration)
    "rd_w4a8_neon_i4": ("wn_i4_rows12", "sdot"), "rd_w4a8_few_neon_i4": ("rd_w4n_few_0_1_4", "sdot"),
    "rd_w4a8_few_neon_f4": ("rd_w4n_few_1_1_4", "sdot"),
}
#: bytes of B one iteration of a few-row kernel's loop reads (a step of 8 panels of 8 columns,
#: one row; w4a8: a quad step of 4 panels)
FEW_BYTES = {"rd_few_neon_f32": 256, "rd_few_neon_bf16w": 128, "rd_few_neon_i8w": 64, "rd_few_neon_f8w": 64,
             "rd_few_neon_f4w": 32, "rd_few_neon_i4w": 32, "rd_w4a8_few_neon_i4": 64, "rd_w4a8_few_neon_f4": 64}
MATTR = "+bf16,+i8mm,+dotprod"
#: one independent instance of each instruction, for the pipes
PROBE = {"fmla": "fmla v{d}.4s, v0.4s, v1.s[0]", "bfmmla": "bfmmla v{d}.4s, v0.8h, v1.8h",
         "usmmla": "usmmla v{d}.4s, v0.16b, v1.16b", "udot": "udot v{d}.4s, v0.16b, v1.4b[0]",
         "sdot": "sdot v{d}.4s, v0.16b, v1.4b[0]", "fmla.2d": "fmla v{d}.2d, v0.2d, v1.d[0]"}


def tool(name):
    for cand in (name + "-19", name):
        if shutil.which(cand):
            return cand
    sys.exit(f"arm_mca: {name} (Debian's llvm-19) is needed")


def mca(asm, cpu, mca_bin):
    """(cycles an iteration) predicted by llvm-mca for the loop `asm`."""
    out = subprocess.run([mca_bin, "-mtriple=aarch64", f"-mcpu={cpu}", f"-mattr={MATTR}", "-iterations=300"],
                         input=asm, capture_output=True, text=True, check=True).stdout
    return int(re.search(r"Total Cycles:\s+(\d+)", out).group(1)) / 300.0


def pipes(insn, cpu, mca_bin):
    """Instances of `insn` the model issues a cycle (24 independent ones)."""
    return 24.0 / mca("\n".join(PROBE[insn].format(d=8 + i) for i in range(24)) + "\n", cpu, mca_bin)


def loops(obj, symbol, objdump):
    """The innermost loops of `symbol` in `obj`: lists of instruction lines between a backward
    branch's target and the branch, with no branch between them."""
    text = subprocess.run([objdump, "-d", f"--mattr={MATTR}", "--no-show-raw-insn", f"--disassemble-symbols={symbol}",
                           obj], capture_output=True, text=True, check=True).stdout
    insns = []
    for line in text.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S.*)$", line)
        if m:
            insns.append((int(m.group(1), 16), m.group(2).split("//")[0].strip()))
    found = []
    for i, (addr, ins) in enumerate(insns):
        m = re.match(r"(b\.\w+|cbnz|cbz|tbnz|tbz|b)\s+.*?0x([0-9a-f]+)|(b\.\w+|cbnz|cbz|b)\s+([0-9a-f]+)\s", ins + " ")
        if not m:
            continue
        target = int(m.group(2) or m.group(4), 16)
        if target < addr:
            body = [x for a, x in insns if target <= a <= addr]
            # innermost, straight-line loops only: no other branch inside
            if not any(re.match(r"(b\.\w+|b|cbnz|cbz|tbnz|tbz|bl|ret)\s", x + " ") for x in body[:-1]):
                found.append(body)
    return found


def build(cc, out):
    """Compile the NEON kernel files with `cc` into `out`; object paths."""
    objs = [os.path.join(out, name + ".o") for name in SOURCES]
    for name, obj in zip(SOURCES, objs):
        subprocess.run(shlex.split(cc) + ["-O3", "-ffp-contract=off", "-fno-strict-aliasing", "-c",
                                         os.path.join(REPO, "csrc", "kernels", name), "-I",
                                         os.path.join(REPO, "csrc"), "-o", obj], check=True)
    return objs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cc", action="append", help="aarch64 compiler command (repeatable)")
    args = ap.parse_args()
    ccs = args.cc or [c for c in ("aarch64-linux-gnu-gcc", "clang-19 --target=aarch64-linux-gnu")
                      if shutil.which(shlex.split(c)[0])]
    mca_bin, objdump = tool("llvm-mca"), tool("llvm-objdump")
    rates = {(insn, cpu): pipes(insn, cpu, mca_bin) for insn in PROBE for cpu in CPUS}
    print("pipes a cycle the models give each instruction: " +
          ", ".join(f"{insn} {'/'.join(f'{rates[insn, c]:.0f}' for c in CPUS)}" for insn in PROBE)
          + f" ({', '.join(CPUS)})")
    print(f"{'compiler':<14} {'kernel':<27} {'insn/iter':>9} " + " ".join(f"{c + ' cyc (% bound)':>26}" for c in CPUS))
    with tempfile.TemporaryDirectory() as tmp:
        for cc in ccs:
            objs = build(cc, tmp)
            for symbol, (rows12, insn) in KERNELS.items():
                # (gcc may clone a static body with a constant argument folded in)
                names = [n for sym in (symbol, rows12) if sym for n in (sym, sym + ".constprop.0")]
                bodies = [b for o in objs for sym in names for b in loops(o, sym, objdump)]
                op = insn.split(".")[0]
                if not bodies:
                    print(f"{shlex.split(cc)[0]:<14} {symbol:<27} (no loop found)")
                    continue
                # (a few-row kernel's one-row loop: of those with the most fmla, the most loads)
                body = max(bodies, key=lambda b: (sum(x.split()[0] == op for x in b if x.split()),
                                                  sum(x.split()[0].startswith("ld") for x in b if x.split())
                                                  if symbol in FEW_BYTES else 0))
                count, cells = sum(x.split()[0] == op for x in body if x.split()), []
                # as llvm-mca reads it: symbols dropped, the closing branch's target made local
                asm = "\n".join([re.sub(r"<[^>]*>", "", x) for x in body[:-1]] + ["b.ne ."]) + "\n"
                for cpu in CPUS:
                    cyc = mca(asm, cpu, mca_bin)
                    cells.append(f"{cyc:8.2f} ({100 * count / rates[insn, cpu] / cyc:5.1f}%)" if symbol not in
                                 FEW_BYTES else f"{cyc:8.2f} ({FEW_BYTES[symbol] / cyc:4.1f} B/c)")
                print(f"{shlex.split(cc)[0]:<14} {symbol:<27} {count:>9} " + " ".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()

/*
 * The NEON instructions of extensions by encoding (UDOT by element, USMMLA,
 * BFMMLA), for the kernels (kernels/rd_neon_dot.c) and the peak probes
 * (probe/rd_peak.c): every assembler takes .inst, whatever extensions it
 * knows (clang 14's rejects these mnemonics under any .arch directive);
 * the registers the compiler chose are decoded by an assembler macro.
 * The including file gets the macro in its assembly once.
 */
#ifndef RD_NEON_INSN_H
#define RD_NEON_INSN_H

/* rd_vnum SYM, vN: SYM = N */
__asm__(".macro rd_vnum sym, reg\n"
        ".irp n,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31\n"
        ".ifc \\reg,v\\n\n"
        ".set \\sym, \\n\n"
        ".endif\n"
        ".endr\n"
        ".endm\n");

/* acc (4 lanes of 32 bits) += vn . element idx of vm (4 bytes by lane):
 * UDOT (vector, by element, FEAT_DotProd), the encoding Q=1 | BASE |
 * H<<11 | L<<21 | M<<20 | Rm<<16 | Rn<<5 | Rd, with the index H:L and the
 * register Vm = M:Rm (BFDOT, SDOT and SUDOT by element differ only in
 * BASE). */
#define RD_DOT_BY_ELEMENT(BASE, acc, vn, vm, idx)                           \
    __asm__("rd_vnum rd_d, %0\n\t"                                          \
            "rd_vnum rd_n, %1\n\t"                                          \
            "rd_vnum rd_m, %2\n\t"                                          \
            ".inst " #BASE " | ((" #idx " >> 1) << 11) | ((" #idx " & 1) << 21)" \
            " | ((rd_m >> 4) << 20) | ((rd_m & 15) << 16) | (rd_n << 5) | rd_d" \
            : "+w"(acc) : "w"(vn), "w"(vm))
#define RD_UDOT(acc, vn, vm, idx) RD_DOT_BY_ELEMENT(0x6f80e000, acc, vn, vm, idx)

/* acc (a 2 x 2 block of 32-bit values) += vn (two rows of 8 bytes or 4
 * halves) times the transpose of vm (two columns): USMMLA (unsigned vn,
 * signed vm, int32) and BFMMLA (bfloat16, float32): Rm<<16 | Rn<<5 | Rd
 * on BASE. */
#define RD_MMLA(BASE, acc, vn, vm)                                          \
    __asm__("rd_vnum rd_d, %0\n\t"                                          \
            "rd_vnum rd_n, %1\n\t"                                          \
            "rd_vnum rd_m, %2\n\t"                                          \
            ".inst " #BASE " | (rd_m << 16) | (rd_n << 5) | rd_d"           \
            : "+w"(acc) : "w"(vn), "w"(vm))
#define RD_USMMLA(acc, vn, vm) RD_MMLA(0x4e80ac00, acc, vn, vm)
#define RD_BFMMLA(acc, vn, vm) RD_MMLA(0x6e40ec00, acc, vn, vm)

#endif /* RD_NEON_INSN_H */

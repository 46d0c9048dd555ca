/* The compute kernels bench/sandbox_cost runs under --sandbox sfi and none: one memory-bound,
 * one compute-bound, one made of indirect calls. Each takes a few milliseconds per call. */
#include <bitship/kernel.h>
#include <stdlib.h>

static uint64_t arg(bs_ctx* ctx, unsigned i) {
    size_t len;
    const uint64_t* in = (const uint64_t*)bs_args(ctx, &len);
    return len >= (i + 1) * sizeof(uint64_t) ? in[i] : 0;
}

/* Memory-bound: sums `count` 64-bit words of region "data" from word `first`. */
BS_KERNEL(sum_words) {
    size_t size;
    const uint64_t* data = (const uint64_t*)bs_region(ctx, "data", &size);
    uint64_t first = arg(ctx, 0), count = arg(ctx, 1);
    if (!data || first > size / 8 || count > size / 8 - first) return (void)bs_fail(ctx, 1, "sum_words: bad range");
    uint64_t s = 0;
    for (uint64_t i = 0; i < count; ++i) s += data[first + i];
    bs_reply(ctx, &s, sizeof s);
}

/* Compute-bound: escape iterations of a side × side Mandelbrot grid, at most `limit` each. */
BS_KERNEL(mandelbrot) {
    uint64_t side = arg(ctx, 0), limit = arg(ctx, 1), total = 0;
    for (uint64_t y = 0; y < side; ++y)
        for (uint64_t x = 0; x < side; ++x) {
            double cr = -2.0 + 2.5 * (double)x / (double)side, ci = -1.25 + 2.5 * (double)y / (double)side;
            double zr = 0, zi = 0;
            uint64_t n = 0;
            while (n < limit && zr * zr + zi * zi <= 4.0) {
                double t = zr * zr - zi * zi + cr;
                zi = 2 * zr * zi + ci;
                zr = t;
                ++n;
            }
            total += n;
        }
    bs_reply(ctx, &total, sizeof total);
}

/* Indirect calls: a tiny bytecode interpreter dispatching every instruction through a table of
 * function pointers (its program in a writable global). */
struct vm {
    uint64_t acc, x;
    uint32_t pc;
};
typedef void (*op_fn)(struct vm*);
static void op_add(struct vm* m) { m->acc += m->x; }
static void op_mul(struct vm* m) { m->acc = m->acc * 3 + 1; }
static void op_xor(struct vm* m) { m->acc ^= m->acc >> 7; }
static void op_inc(struct vm* m) { m->x += 1; }
static op_fn ops[4] = {op_add, op_mul, op_xor, op_inc};
static uint8_t program[64];

BS_KERNEL(interpret) {
    uint64_t steps = arg(ctx, 0);
    for (unsigned i = 0; i < sizeof program; ++i) program[i] = (uint8_t)((i * 7 + i / 3) & 3);
    struct vm m = {1, 1, 0};
    for (uint64_t s = 0; s < steps; ++s) {
        ops[program[m.pc]](&m);
        m.pc = (m.pc + 1) & 63;
    }
    bs_reply(ctx, &m.acc, sizeof m.acc);
}

/* Allocates 1 MiB, touches every page, and frees nothing: a leak per call. */
BS_KERNEL(leak_mib) {
    char* p = (char*)malloc(1u << 20);
    if (!p) return (void)bs_fail(ctx, 1, "leak_mib: malloc answered NULL");
    for (uint64_t off = 0; off < (1u << 20); off += 4096) p[off] = (char)off;
    uint64_t first = (uint64_t)(unsigned char)p[4096];
    bs_reply(ctx, &first, sizeof first);
}

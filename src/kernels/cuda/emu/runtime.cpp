// The emulator's scheduler (cuda_emu.h): one block at a time, its lanes as ucontext fibers.
//
// A lane runs until it reaches a barrier (__syncthreads, a warp shuffle or vote) or exits;
// it then hands over to the next lane (in lane order) that can run, and the last of a round to
// the scheduler, which starts the next round at the first lane that can run. A barrier completes
// when every lane of the block (or warp) has arrived at it: the lane that arrives last goes on
// without switching. Reaching a barrier at a different call site than the lanes already
// waiting, a barrier after a lane of the block (warp) has exited, or a round with no lane able
// to run fails the launch with a message (undefined behaviour on a GPU).
#include "cuda_emu.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define HSX_EMU_ASAN 1
#endif

namespace hsx_emu {

thread_local Lane* tl_lane = nullptr;
thread_local BlockIds* tl_ids = nullptr;

namespace {

#if defined(HSX_EMU_ASAN)
constexpr size_t STACK_BYTES = 1u << 20;
#else
constexpr size_t STACK_BYTES = 256u << 10;
#endif
constexpr size_t GUARD_BYTES = 4096;

// Context switches. On x86-64 a hand-written switch of the callee-saved registers (ucontext's
// swapcontext makes a sigprocmask system call per switch, which dominated the run time);
// elsewhere ucontext.
#if defined(__x86_64__)
extern "C" void hsx_emu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .p2align 4
    .globl hsx_emu_switch
    .hidden hsx_emu_switch
    .type hsx_emu_switch, @function
hsx_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size hsx_emu_switch, .-hsx_emu_switch
)");
struct Context {
    void* sp = nullptr;
};
void lane_entry();
[[noreturn]] void lane_start() {
    lane_entry();
    std::abort();
}
// A fresh context on `stack`: the first switch to it "returns" into lane_start with the
// stack aligned as after a call.
void make_context(Context* c, char* stack, size_t bytes) {
    uintptr_t top = ((uintptr_t)(stack + bytes)) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = nullptr;                  // lane_start's (never used) return address
    *--sp = (void*)&lane_start;       // where hsx_emu_switch returns to
    for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12-r15
    c->sp = sp;
}
inline void raw_switch(Context* from, Context* to) { hsx_emu_switch(&from->sp, to->sp); }
#else
struct Context {
    ucontext_t uc;
};
void lane_entry();
void make_context(Context* c, char* stack, size_t bytes) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, lane_entry, 0);
}
inline void raw_switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
#endif

enum class State { Fresh, Running, WaitBlock, WaitWarp, Done };

// A cp.async copy issued and not yet waited for: its source bytes (read at issue; the global
// memory a kernel copies from does not change while it runs) and its commit group.
struct AsyncCopy {
    void* dst;
    unsigned char data[16];
    unsigned bytes;
    unsigned group;
};

struct Fiber {
    Lane lane;
    Context ctx;
    State state;
    unsigned wait_gen;
    char* stack;  // usable part (above the guard page)
    std::vector<AsyncCopy> pending;
    unsigned groups = 0;  // groups committed so far
};

struct Warp {
    unsigned present = 0;  // lanes that exist
    unsigned exited = 0;
    int arrived = 0;
    unsigned gen = 0;
    const char* site = nullptr;
    unsigned mask = 0;
    uint64_t slots[2][32] = {};
};

struct Block {
    BlockIds ids;
    int n = 0;
    int exited = 0;
    int arrived = 0;
    unsigned gen = 0;
    const char* site = nullptr;
    int vote[2] = {0, 0};
    Warp warps[32];
    std::vector<unsigned char> dyn;
    Context sched;
    Fiber* lanes = nullptr;  // the block's n lanes
    void (*body)(void*) = nullptr;
    void* arg = nullptr;
    bool failed = false;
};

thread_local Block* tl_block = nullptr;
thread_local Fiber* tl_fiber = nullptr;
thread_local std::string tl_error;
// The lanes' mapped stacks (each after a guard page), reused by this thread's launches and
// unmapped when the thread exits: a process that launches from many short-lived threads (a
// test harness: one per test) would otherwise keep every thread's stacks mapped, two
// mappings each, until it hits the kernel's map count limit.
struct LaneStacks {
    std::vector<char*> stacks;
    ~LaneStacks() {
        for (char* s : stacks) {
#if defined(HSX_EMU_ASAN)
            // A lane's outermost frames never return, so their redzones stay poisoned, and
            // GCC 12's libasan leaves the shadow of unmapped memory as it was: a later map at
            // the same address (a checkpoint's weights) would read as a stack overflow.
            ASAN_UNPOISON_MEMORY_REGION(s, STACK_BYTES);
#endif
            munmap(s - GUARD_BYTES, STACK_BYTES + GUARD_BYTES);
        }
    }
};
thread_local LaneStacks tl_stacks;

// Every switch: from context `from` to `to`, whose stack is `stack` (`bytes`; null for the
// thread's own, the scheduler's). Under ASan the switch is announced; the fake stack of the
// context left is kept in its frame until it is resumed, or dropped when it is `exiting`.
void jump(Context* from, Context* to, char* stack, size_t bytes, bool exiting) {
#if defined(HSX_EMU_ASAN)
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(exiting ? nullptr : &fake, stack, bytes);
    raw_switch(from, to);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    (void)stack, (void)bytes, (void)exiting;
    raw_switch(from, to);
#endif
}
void switch_to_lane(Fiber* f, Block* b) { jump(&b->sched, &f->ctx, f->stack, STACK_BYTES, false); }
void switch_to_sched(Fiber* f, Block* b, bool exiting) { jump(&f->ctx, &b->sched, nullptr, 0, exiting); }

bool runnable(const Fiber& f, const Block& b) {
    switch (f.state) {
        case State::Fresh:
            return true;
        case State::WaitBlock:
            return b.gen != f.wait_gen;
        case State::WaitWarp:
            return b.warps[f.lane.lin >> 5].gen != f.wait_gen;
        default:
            return false;
    }
}

// The first lane from `from` on that can run now. Lanes run in a fixed order (lane order within
// a round, rounds until all have exited), so that a launch repeats bit for bit.
Fiber* next_runnable(Block& b, int from) {
    for (int i = from; i < b.n; ++i)
        if (runnable(b.lanes[i], b)) return &b.lanes[i];
    return nullptr;
}

// Leaves lane `f` (waiting at a barrier, or `exiting`) for the next lane of the round that can
// run, switching to it directly: one switch per wait instead of two through the scheduler
// (the switches and the scheduler's loop were a third of an emulated model's time). Goes back
// to the scheduler at the end of the round or when the launch failed.
void leave_lane(Fiber* f, Block* b, bool exiting) {
    Fiber* next = b->failed ? nullptr : next_runnable(*b, f->lane.lin + 1);
    if (next == nullptr) {
        switch_to_sched(f, b, exiting);
        return;
    }
    next->state = State::Running;
    tl_fiber = next;
    tl_lane = &next->lane;
    jump(&f->ctx, &next->ctx, next->stack, STACK_BYTES, exiting);
}

char* stack_at(size_t i) {
    while (tl_stacks.stacks.size() <= i) {
        void* m = mmap(nullptr, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return nullptr;
        // A lane that overflows its stack faults on the guard page instead of corrupting the
        // next one.
        mprotect(m, GUARD_BYTES, PROT_NONE);
        tl_stacks.stacks.push_back(static_cast<char*>(m) + GUARD_BYTES);
    }
    return tl_stacks.stacks[i];
}

// Records the first error of the launch and parks the lane for good.
[[noreturn]] void fail_lane(const std::string& msg) {
    Block* b = tl_block;
    if (!b->failed) {
        b->failed = true;
        char where[96];
        std::snprintf(where, sizeof where, " (block %u,%u,%u thread %u,%u,%u)", b->ids.bid.x,
                      b->ids.bid.y, b->ids.bid.z, tl_lane->tid.x, tl_lane->tid.y, tl_lane->tid.z);
        tl_error = msg + where;
    }
    Fiber* f = tl_fiber;
    f->state = State::Done;
    switch_to_sched(f, b, true);
    std::abort();  // never resumed
}

void lane_entry() {
    Block* b = tl_block;
    Fiber* f = tl_fiber;
#if defined(HSX_EMU_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    b->body(b->arg);
    if (!f->pending.empty()) fail_lane("a thread exited with cp.async copies never waited for");
    f->state = State::Done;
    b->exited += 1;
    b->warps[f->lane.lin >> 5].exited |= 1u << (f->lane.lin & 31);
    leave_lane(f, b, true);
    std::abort();
}

std::string waiting_report(const std::vector<Fiber>& lanes) {
    std::string s;
    int shown = 0;
    for (const Fiber& f : lanes) {
        if (f.state == State::Done || shown == 4) continue;
        ++shown;
        char line[96];
        std::snprintf(line, sizeof line, " thread %d waits at a %s;", f.lane.lin,
                      f.state == State::WaitBlock ? "__syncthreads" : "warp operation");
        s += line;
    }
    return s;
}

// Runs every lane of block `b` to completion.
bool run_block(Block& b, std::vector<Fiber>& lanes) {
    const uint3 bd = b.ids.bdim;
    b.exited = b.arrived = 0;
    b.site = nullptr;
    b.vote[0] = b.vote[1] = 0;
    // Only the warps the block has: the others are never touched (and zero from new Block()).
    for (int w = 0; w < (b.n + 31) / 32; ++w) b.warps[w] = Warp();
    for (int i = 0; i < b.n; ++i) {
        Fiber& f = lanes[i];
        f.lane.lin = i;
        f.lane.tid = uint3{i % bd.x, (i / bd.x) % bd.y, i / (bd.x * bd.y)};
        f.state = State::Fresh;
        f.pending.clear();
        f.groups = 0;
        b.warps[i >> 5].present |= 1u << (i & 31);
#if defined(HSX_EMU_ASAN)
        ASAN_UNPOISON_MEMORY_REGION(f.stack, STACK_BYTES);
#endif
        make_context(&f.ctx, f.stack, STACK_BYTES);
    }
    b.lanes = lanes.data();
    // Each round starts at the first lane that can run; the lanes hand over to each other
    // (leave_lane) and the last of the round comes back here.
    while (b.exited < b.n) {
        Fiber* f = next_runnable(b, 0);
        if (f == nullptr) {
            tl_error = "deadlock: no thread can go on;" + waiting_report(lanes);
            return false;
        }
        f->state = State::Running;
        tl_fiber = f;
        tl_lane = &f->lane;
        switch_to_lane(f, &b);
        if (b.failed) return false;
    }
    return true;
}

}  // namespace

void fail(const char* msg) { fail_lane(msg); }

void fail_args(int want, int got) {
    char m[128];
    if (want >= 0)
        std::snprintf(m, sizeof m, "the kernel takes %d arguments, the launch passed %d", want, got);
    else
        std::snprintf(m, sizeof m, "argument %d: the launch passed %d bytes, the kernel takes another size",
                      -want, got);
    tl_error = m;
}

// Sites are string literals: the same call site passes the same pointer, so the comparison
// of the text (a tenth of the emulator's time in shuffle-heavy kernels) is only for the rest.
static bool same_site(const char* a, const char* b) { return a == b || std::strcmp(a, b) == 0; }

void sync_block(const char* site) { (void)sync_block_or(0, site); }

int sync_block_or(int pred, const char* site) {
    Block* b = tl_block;
    Fiber* f = tl_fiber;
    if (b->exited > 0) fail_lane(std::string("__syncthreads at ") + site + " after a thread of the block exited");
    if (b->arrived == 0) {
        b->site = site;
    } else if (!same_site(b->site, site)) {
        fail_lane(std::string("divergent __syncthreads: ") + site + " while others wait at " + b->site);
    }
    const unsigned gen = b->gen;
    b->vote[gen & 1] |= pred;
    f->wait_gen = gen;
    if (++b->arrived == b->n) {
        b->arrived = 0;
        b->gen = gen + 1;
        b->vote[(gen + 1) & 1] = 0;  // its last readers have all passed this barrier
    } else {
        f->state = State::WaitBlock;
        leave_lane(f, b, false);
    }
    return b->vote[gen & 1];
}

static unsigned warp_arrive(unsigned mask, const char* site) {
    Block* b = tl_block;
    Fiber* f = tl_fiber;
    Warp& w = b->warps[f->lane.lin >> 5];
    const unsigned me = 1u << (f->lane.lin & 31);
    if ((mask & me) == 0) fail_lane(std::string("warp operation at ") + site + ": the mask does not name the calling thread");
    if (mask != w.present)
        fail_lane(std::string("warp operation at ") + site + ": the mask names missing threads or leaves out present ones (partial masks are not emulated)");
    if (w.exited != 0) fail_lane(std::string("warp operation at ") + site + " after a thread of the warp exited");
    if (w.arrived == 0) {
        w.site = site;
        w.mask = mask;
    } else if (!same_site(w.site, site) || w.mask != mask) {
        fail_lane(std::string("divergent warp operation: ") + site + " while others wait at " + w.site);
    }
    return w.gen;
}

static void warp_wait(unsigned gen) {
    Block* b = tl_block;
    Fiber* f = tl_fiber;
    Warp& w = b->warps[f->lane.lin >> 5];
    f->wait_gen = gen;
    // The warp's lanes: 32 but in the block's last, short warp (not a popcount of `present`:
    // that was a libgcc call on every arrival).
    const int size = b->n - (f->lane.lin & ~31) < 32 ? b->n - (f->lane.lin & ~31) : 32;
    if (++w.arrived == size) {
        w.arrived = 0;
        w.gen = gen + 1;
    } else {
        f->state = State::WaitWarp;
        leave_lane(f, b, false);
    }
}

uint64_t warp_exchange(unsigned mask, uint64_t bits, int src_lane, const char* site) {
    const unsigned gen = warp_arrive(mask, site);
    Warp& w = tl_block->warps[tl_fiber->lane.lin >> 5];
    w.slots[gen & 1][tl_fiber->lane.lin & 31] = bits;
    warp_wait(gen);
    if (((w.present >> src_lane) & 1u) == 0) fail_lane(std::string("shuffle at ") + site + " reads a thread that does not exist");
    return w.slots[gen & 1][src_lane];
}

unsigned warp_ballot(unsigned mask, int pred, const char* site) {
    const unsigned gen = warp_arrive(mask, site);
    Warp& w = tl_block->warps[tl_fiber->lane.lin >> 5];
    w.slots[gen & 1][tl_fiber->lane.lin & 31] = pred ? 1 : 0;
    warp_wait(gen);
    unsigned r = 0;
    for (int i = 0; i < 32; ++i)
        if ((w.present >> i) & 1u) r |= (w.slots[gen & 1][i] ? 1u : 0u) << i;
    return r;
}

void async_copy(void* dst, const void* src, unsigned src_bytes, unsigned bytes) {
    if ((bytes != 4 && bytes != 8 && bytes != 16) || src_bytes > bytes ||
        reinterpret_cast<uintptr_t>(dst) % bytes != 0 ||
        (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % bytes != 0))
        fail_lane("cp.async: size not 4, 8 or 16 bytes, or an address not aligned to it");
    Fiber* f = tl_fiber;
    AsyncCopy c{dst, {}, bytes, f->groups};
    std::memcpy(c.data, src, src_bytes);  // the rest of the bytes stay zero, as src-size asks
    // Until its wait the destination holds NaN bits (0xff bytes): a read not ordered after the
    // wait and a barrier sees NaN instead of whatever a GPU might have delivered by then; so
    // does a lane that runs after this one (fibers run in lane order between barriers) and
    // still reads the data this copy overwrites.
    std::memset(dst, 0xff, bytes);
    f->pending.push_back(c);
}

void async_commit() { tl_fiber->groups += 1; }

void async_wait(unsigned newest) {
    Fiber* f = tl_fiber;
    std::vector<AsyncCopy>& p = f->pending;
    size_t kept = 0;
    for (AsyncCopy& c : p) {
        // Groups older than the `newest` most recent committed ones land; copies of the open
        // (not yet committed) group never do here, as on a GPU.
        if (c.group + newest < f->groups) {
            std::memcpy(c.dst, c.data, c.bytes);
        } else {
            p[kept++] = c;
        }
    }
    p.resize(kept);
}

void* dyn_shared() { return tl_block->dyn.data(); }

int launch(const Launch* l, void (*body)(void*), void* arg) {
    tl_error.clear();
    const unsigned long long n = (unsigned long long)l->block[0] * l->block[1] * l->block[2];
    if (n == 0 || n > 1024 || l->block[2] > 64 || l->grid[1] > 65535 || l->grid[2] > 65535 ||
        l->grid[0] == 0 || l->grid[1] == 0 || l->grid[2] == 0) {
        char m[160];
        std::snprintf(m, sizeof m, "invalid launch: grid (%u, %u, %u), block (%u, %u, %u)",
                      l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2]);
        tl_error = m;
        return 1;
    }
    if (l->shared_bytes > 48u * 1024u) {
        tl_error = "dynamic shared memory over 48 KiB without cudaFuncAttributeMaxDynamicSharedMemorySize";
        return 1;
    }
    Block* b = new Block();
    b->n = (int)n;
    b->body = body;
    b->arg = arg;
    b->ids.bdim = uint3{l->block[0], l->block[1], l->block[2]};
    b->ids.gdim = uint3{l->grid[0], l->grid[1], l->grid[2]};
    b->dyn.assign(l->shared_bytes, 0xA5);  // never zeroed on a GPU either
    std::vector<Fiber> lanes(n);
    for (size_t i = 0; i < n; ++i) {
        lanes[i].stack = stack_at(i);
        if (lanes[i].stack == nullptr) {
            tl_error = "cannot map a lane stack";
            delete b;
            return 1;
        }
    }
    Block* prev_block = tl_block;
    BlockIds* prev_ids = tl_ids;
    tl_block = b;
    tl_ids = &b->ids;
    bool ok = true;
    for (unsigned z = 0; ok && z < l->grid[2]; ++z)
        for (unsigned y = 0; ok && y < l->grid[1]; ++y)
            for (unsigned x = 0; ok && x < l->grid[0]; ++x) {
                b->ids.bid = uint3{x, y, z};
                ok = run_block(*b, lanes);
            }
    tl_block = prev_block;
    tl_ids = prev_ids;
    delete b;
    // 2: a fault while the kernel ran (a trap, a deadlock, a divergent barrier), which on a
    // GPU leaves the context unusable; 1 (above): a launch refused before it ran.
    return ok ? 0 : 2;
}

}  // namespace hsx_emu

// The message of the last failed launch on this thread (empty if none).
extern "C" size_t hsx_emu_last_error(char* buf, size_t cap) {
    const std::string& e = hsx_emu::tl_error;
    if (cap > 0) {
        const size_t n = e.size() < cap - 1 ? e.size() : cap - 1;
        std::memcpy(buf, e.data(), n);
        buf[n] = 0;
    }
    return e.size();
}

// The calling thread's lane stacks (their usable parts, `*bytes` each): how many it has, the
// first `cap` of them written to `out`. For the test of what they leave behind.
extern "C" size_t hsx_emu_lane_stacks(const void** out, size_t cap, size_t* bytes) {
    const std::vector<char*>& s = hsx_emu::tl_stacks.stacks;
    *bytes = hsx_emu::STACK_BYTES;
    for (size_t i = 0; i < s.size() && i < cap; ++i) out[i] = s[i];
    return s.size();
}

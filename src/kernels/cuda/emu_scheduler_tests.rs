//! The emulator's scheduler (emu/runtime.cpp) on kernels of its own (emu/scheduler_probe.cpp):
//! lanes that meet at warp shuffles and block barriers in every block of a grid, and the faults
//! it must report instead of hanging. The model suites only ever see the first kind.

use super::driver_emu::last_error;

unsafe extern "C" {
    fn hsx_emu_scheduler_probe(which: i32, grid: u32, block: u32, out: *mut u32) -> i32;
}

const SUM: i32 = 0;
const DIVERGENT: i32 = 1;
const LEFT_BY_EXITS: i32 = 2;
const SHORT_WARP: i32 = 3;

/// Runs probe `which`: its `grid × block` outputs, or the launch's code and message.
fn probe(which: i32, grid: u32, block: u32) -> Result<Vec<u32>, (i32, String)> {
    let mut out = vec![u32::MAX; (grid * block) as usize];
    // SAFETY: the probes write at most one u32 per thread of the grid into `out`.
    match unsafe { hsx_emu_scheduler_probe(which, grid, block, out.as_mut_ptr()) } {
        0 => Ok(out),
        code => Err((code, last_error())),
    }
}

#[test]
fn shuffles_and_barriers_meet_in_every_block() {
    for (grid, block) in [(1, 32), (3, 96), (2, 1024)] {
        let out = probe(SUM, grid, block).unwrap();
        let total = block * (block - 1) / 2;
        for (b, row) in out.chunks(block as usize).enumerate() {
            assert!(
                row.iter().all(|&v| v == total + b as u32),
                "grid {grid} × {block}: {row:?}"
            );
        }
    }
}

#[test]
fn divergent_barriers_fail_the_launch() {
    let (code, msg) = probe(DIVERGENT, 1, 64).unwrap_err();
    assert_eq!(code, 2);
    assert!(msg.starts_with("divergent __syncthreads"), "{msg}");
    assert!(msg.contains("block 0,0,0 thread 32,0,0"), "{msg}");
}

#[test]
fn a_barrier_no_one_else_reaches_is_a_deadlock() {
    let (code, msg) = probe(LEFT_BY_EXITS, 2, 64).unwrap_err();
    assert_eq!(code, 2);
    assert_eq!(
        msg,
        "deadlock: no thread can go on; thread 0 waits at a __syncthreads;"
    );
}

#[test]
fn a_full_mask_on_a_short_warp_fails_the_launch() {
    let (code, msg) = probe(SHORT_WARP, 1, 48).unwrap_err();
    assert_eq!(code, 2);
    assert!(msg.contains("the mask names missing threads"), "{msg}");
    assert!(msg.contains("thread 32,0,0"), "{msg}");
    // The same launch on whole warps runs, and the next launch on this thread is clean.
    let out = probe(SHORT_WARP, 1, 64).unwrap();
    assert!(out.iter().enumerate().all(|(t, &v)| v == t as u32 ^ 1));
}

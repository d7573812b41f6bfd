//! Fault-injection hooks for the reliability suite (tests/reliability_*.rs, tests/soak/).
//!
//! Both hooks are process-global and off by default: until a test installs one, the only cost
//! is one relaxed atomic load per file write or per model step. They exist so tests can prove
//! the engine's error paths end to end without a broken disk or a broken device:
//! - [`set_write_fault`]: consulted by the connector's writer after the tmp file is created and
//!   its header written (a half-written tmp, like a disk filling up mid-write); an `Err` fails
//!   that write exactly as the OS error would.
//! - [`set_step_fault`]: consulted by the model runner before each forward pass; a message fails
//!   the whole step, as a backend error would.
//!
//! Hooks see the file path / the step plan, so a test can target only its own output directory
//! or request ids and not disturb other tests of the same process.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::actors::messages::StepPlan;

/// Decides whether writing the file at this path fails, and with which OS error.
pub type WriteFault = dyn Fn(&Path) -> Option<std::io::Error> + Send + Sync;
/// Decides whether this step fails, and with which message.
pub type StepFault = dyn Fn(&StepPlan) -> Option<String> + Send + Sync;

static WRITE_ON: AtomicBool = AtomicBool::new(false);
static WRITE: RwLock<Option<Arc<WriteFault>>> = RwLock::new(None);
static STEP_ON: AtomicBool = AtomicBool::new(false);
static STEP: RwLock<Option<Arc<StepFault>>> = RwLock::new(None);

/// Installs (or with `None` removes) the write fault hook.
pub fn set_write_fault(hook: Option<Arc<WriteFault>>) {
    let mut slot = WRITE.write().unwrap_or_else(|p| p.into_inner());
    WRITE_ON.store(hook.is_some(), Ordering::SeqCst);
    *slot = hook;
}

/// Installs (or with `None` removes) the step fault hook.
pub fn set_step_fault(hook: Option<Arc<StepFault>>) {
    let mut slot = STEP.write().unwrap_or_else(|p| p.into_inner());
    STEP_ON.store(hook.is_some(), Ordering::SeqCst);
    *slot = hook;
}

pub(crate) fn write_fault(path: &Path) -> Option<std::io::Error> {
    if !WRITE_ON.load(Ordering::Relaxed) {
        return None;
    }
    let hook = WRITE.read().unwrap_or_else(|p| p.into_inner()).clone();
    hook.and_then(|h| h(path))
}

pub(crate) fn step_fault(plan: &StepPlan) -> Option<String> {
    if !STEP_ON.load(Ordering::Relaxed) {
        return None;
    }
    let hook = STEP.read().unwrap_or_else(|p| p.into_inner()).clone();
    hook.and_then(|h| h(plan))
}

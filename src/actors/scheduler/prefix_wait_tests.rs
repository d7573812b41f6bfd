//! Requests running at the same time share prefix blocks: the scheduler state driven with a
//! real block pool, as the actors do (reserve, plan, publish a step's completed blocks, apply,
//! release), without channels.

use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use crate::actors::block_manager::BlockPool;

const BS: usize = 4;

fn id(s: &str) -> RequestId {
    RequestId::new(s).unwrap()
}

fn req(name: &str, prompt: &[u32]) -> Request {
    Request {
        id: id(name),
        prompt: prompt.into(),
        max_tokens: 1,
        include_output_tokens: false,
        path: PathBuf::from(format!("/tmp/{name}.safetensors")),
        prefixes: Vec::new(),
    }
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|t| (t * 7 + 3) % 50).collect()
}

struct Sim {
    s: SchedulerState,
    pool: BlockPool,
    /// Tokens computed per request.
    computed: HashMap<String, usize>,
    /// Each request's first computed position.
    starts: HashMap<String, usize>,
}

impl Sim {
    fn new(budget: usize) -> Self {
        let limits = SchedulerLimits {
            max_num_batched_tokens: budget,
            max_num_seqs: 8,
            max_waiting: 8,
            max_model_len: 100,
            vocab_size: 50,
            kv_capacity_tokens: 64 * BS,
            row_bytes: 0,
            max_pending_bytes: usize::MAX,
        };
        Self {
            s: SchedulerState::new(limits),
            pool: BlockPool::new(64, BS, 0).with_prefix_cache(1 << 20),
            computed: HashMap::new(),
            starts: HashMap::new(),
        }
    }

    /// Reserves, plans and returns the plan (the scheduler actor's `schedule`).
    fn plan(&mut self) -> Option<StepPlan> {
        let granted = self.pool.reserve(&self.s.admission_candidates());
        let plan = self.s.plan_step(granted);
        for id in self.s.take_unused_grants() {
            self.pool.free(&id);
        }
        self.s.take_prefix_rows();
        plan
    }

    /// Runs the step: its completed prompt blocks are published (the runner's report), then
    /// the output applied (or the step failed) and the released blocks freed.
    fn run(&mut self, plan: &StepPlan, fail: bool) -> Effects {
        for c in &plan.chunks {
            *self.computed.entry(c.id.to_string()).or_default() += c.len;
            self.starts.entry(c.id.to_string()).or_insert(c.start);
        }
        let fx = if fail {
            self.s.fail_step(plan.step, "boom")
        } else {
            self.publish(plan);
            self.s.apply(&output(plan))
        };
        for id in &fx.release_blocks {
            self.pool.free(id);
        }
        fx
    }

    fn publish(&mut self, plan: &StepPlan) {
        for c in &plan.chunks {
            let r = self.s.running.iter().find(|r| r.req.id == c.id);
            let len = r.expect("running").req.prompt.len();
            let last = ((c.start + c.len) / BS).min(len / BS);
            let first = c.start / BS;
            let rows = (first..last).map(|_| Arc::from(&[0u8][..])).collect();
            self.pool.computed(&c.id, first, rows);
        }
    }

    fn run_all(&mut self) {
        while let Some(plan) = self.plan() {
            self.run(&plan, false);
        }
        assert!(self.s.is_idle());
    }
}

fn output(plan: &StepPlan) -> StepOutput {
    StepOutput {
        step: plan.step,
        sampled: (plan.chunks.iter())
            .filter(|c| c.sample)
            .map(|c| (c.id.clone(), 7))
            .collect(),
        failed: Vec::new(),
    }
}

fn names(plan: &StepPlan) -> Vec<String> {
    plan.chunks.iter().map(|c| c.id.to_string()).collect()
}

#[test]
fn identical_prompts_at_once_are_computed_once() {
    let mut sim = Sim::new(64);
    let p = prompt(20);
    sim.s.submit(req("a", &p)).unwrap();
    sim.s.submit(req("b", &p)).unwrap();
    // b waits (no tokens scheduled) while a computes the blocks it needs.
    let first = sim.plan().unwrap();
    assert_eq!(names(&first), ["a"]);
    assert_eq!(sim.s.stats().waiting, 1);
    sim.run(&first, false);
    sim.run_all();
    // b reuses a's 4 full blocks of its usable 19 tokens: its last 4 tokens are computed.
    assert_eq!(sim.computed["a"], 20);
    assert_eq!(sim.computed["b"], 4);
    assert_eq!(sim.starts["b"], 16);
    assert_eq!(sim.pool.stats().prefix.waited_tokens, 16);
}

#[test]
fn a_waiter_computes_on_its_own_when_the_owner_fails() {
    let mut sim = Sim::new(64);
    let p = prompt(20);
    sim.s.submit(req("a", &p[..8])).unwrap();
    sim.s.submit(req("c", &p)).unwrap();
    sim.s.submit(req("b", &p)).unwrap();
    // c and b wait for a's blocks 0 and 1.
    let first = sim.plan().unwrap();
    assert_eq!(names(&first), ["a"]);
    sim.run(&first, false);
    // c goes on from them and computes blocks 2..5, which b waits for.
    let second = sim.plan().unwrap();
    assert_eq!(names(&second), ["c"]);
    assert_eq!(second.chunks[0].start, 8);
    // c's step fails: b computes those blocks itself.
    let fx = sim.run(&second, true);
    assert_eq!(fx.failed.len(), 1);
    sim.run_all();
    assert_eq!(sim.starts["b"], 8);
    assert_eq!(sim.computed["b"], 12);
    let stats = sim.pool.stats();
    assert_eq!(stats.requests, 0);
    assert_eq!(stats.free + stats.prefix.cached_blocks, 64);
    assert_eq!(stats.prefix.cached_blocks, 5);
}

#[test]
fn requests_behind_a_waiter_are_admitted_past_it() {
    let mut sim = Sim::new(64);
    let p = prompt(20);
    sim.s.submit(req("a", &p[..12])).unwrap();
    sim.s.submit(req("b", &p)).unwrap();
    let other: Vec<u32> = (0..6).map(|t| 40 + t).collect();
    sim.s.submit(req("c", &other)).unwrap();
    // b waits for a's blocks; c, behind it, is admitted.
    let first = sim.plan().unwrap();
    assert_eq!(names(&first), ["a", "c"]);
    sim.run(&first, false);
    // b reuses a's 3 blocks.
    sim.run_all();
    assert_eq!(sim.starts["b"], 12);
    assert_eq!(sim.computed["b"], 8);
}

#[test]
fn an_aborted_waiter_leaves_no_trace() {
    let mut sim = Sim::new(64);
    let p = prompt(20);
    sim.s.submit(req("a", &p)).unwrap();
    sim.s.submit(req("b", &p)).unwrap();
    let first = sim.plan().unwrap();
    let fx = sim.s.abort(&id("b"));
    assert_eq!(fx.failed.len(), 1);
    sim.run(&first, false);
    sim.run_all();
    assert!(!sim.computed.contains_key("b"));
    assert_eq!(sim.pool.stats().prefix.waited_tokens, 0);
}

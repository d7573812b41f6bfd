//! Typed `config.toml`. Unknown keys are rejected with their name; relative paths are resolved
//! against the directory of the config file.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

use crate::actors::messages::OutputDtype;
use crate::chat::RenderLimits;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub model: ModelSection,
    #[serde(default)]
    pub engine: EngineSection,
    #[serde(default)]
    pub output: OutputSection,
    #[serde(default)]
    pub events: EventsSection,
    #[serde(default)]
    pub socket: SocketSection,
    /// The HTTP listener (OpenAI subset, `/metrics`); none when the section is absent.
    #[serde(default)]
    pub http: Option<HttpSection>,
    #[serde(default)]
    pub metrics: MetricsSection,
    #[serde(default)]
    pub logging: LoggingSection,
    #[serde(default)]
    pub chat: ChatSection,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A Hugging Face model directory (config.json + *.safetensors).
    pub path: PathBuf,
    /// `cpu`, `cuda` (device 0), `cuda:N`, or `auto` (CUDA when usable, else CPU); see
    /// [`DeviceChoice`].
    #[serde(default = "default_device")]
    pub device: String,
    /// Compute threads; 0 = every core.
    #[serde(default)]
    pub threads: usize,
    /// How the CPU multiplies bf16 weights: `auto` (the fastest this CPU has), `amx`,
    /// `avx512bf16` (both round activations to bf16, accumulate in f32), `avx512` / `avx2`
    /// (weights widened in registers: f32 compute, the same bits), `f32` (weights widened
    /// panel by panel: f32 compute) or `portable`. A path the CPU lacks is refused at start.
    #[serde(default)]
    pub cpu_bf16_kernel: crate::kernels::Bf16Kernel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DtypeChoice {
    /// The dtype of the weights on disk.
    #[default]
    Auto,
    F32,
    Bf16,
    F16,
    /// float8_e4m3fn with per-token scales, as speculators' `hs_connectors` FP8 files.
    Fp8,
}

impl DtypeChoice {
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        match s {
            "auto" => Ok(Self::Auto),
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f16" | "float16" => Ok(Self::F16),
            "fp8" | "float8_e4m3fn" => Ok(Self::Fp8),
            other => Err(ConfigError::Invalid(format!(
                "dtype {other:?}: expected auto, f32, bf16, f16 or fp8"
            ))),
        }
    }

    /// The file dtype, given the dtype of the weights.
    pub fn resolve(self, weights: OutputDtype) -> OutputDtype {
        match self {
            Self::Auto => weights,
            Self::F32 => OutputDtype::F32,
            Self::Bf16 => OutputDtype::Bf16,
            Self::F16 => OutputDtype::F16,
            Self::Fp8 => OutputDtype::Fp8,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSection {
    /// Token budget of one step (chunked prefill splits prompts to fit).
    pub max_num_batched_tokens: usize,
    /// Requests running at once.
    pub max_num_seqs: usize,
    /// Requests waiting for admission; beyond it submissions are rejected as overloaded.
    pub max_waiting: usize,
    /// Longest request (prompt + generated); 0 = the model's `max_position_embeddings`.
    pub max_model_len: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the cache.
    pub num_blocks: usize,
    /// Layer ids to capture (DESIGN.md §1.1); default `[2, L/2, L-3, L]`.
    pub layer_ids: Option<Vec<usize>>,
    /// dtype of the saved hidden states.
    pub dtype: DtypeChoice,
    /// Host bytes of hidden states held for admitted requests (`T × K × H ×` dtype size each,
    /// plus a 4-byte scale per token for fp8) until their files are written; admission waits
    /// at it, a larger request is rejected.
    pub max_pending_bytes: usize,
    /// Fail a request whose captured rows hold NaN / Inf, or an all-zero row at a layer id
    /// >= 1, instead of writing its file (`false`: write the raw states anyway).
    pub reject_bad_states: bool,
    /// Prefix reuse across requests: bytes of captured rows (and, for hybrid models, of
    /// recurrent-state snapshots at block boundaries) kept with the cached KV blocks of
    /// finished requests, so a request that starts with the same full blocks computes only the
    /// rest; least recently used blocks are evicted. 0 = off.
    pub prefix_cache_bytes: usize,
}

impl Default for EngineSection {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 2048,
            max_num_seqs: 64,
            max_waiting: 1024,
            max_model_len: 0,
            block_size: 16,
            num_blocks: 4096,
            layer_ids: None,
            dtype: DtypeChoice::Auto,
            max_pending_bytes: 2 << 30,
            reject_bad_states: true,
            prefix_cache_bytes: 0,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputSection {
    /// Files go to `{dir}/{request_id}.safetensors`.
    pub dir: PathBuf,
    /// Also hold vLLM's `{file}.lock` (flock) while writing, for clients that poll it.
    pub lock_files: bool,
    /// Files written at once by the writer pool.
    pub max_concurrent_writes: usize,
    /// Let HTTP clients choose the file with `kv_transfer_params.hidden_states_path` (always
    /// inside `dir`; vLLM's `allow_custom_save_path`).
    pub allow_custom_paths: bool,
}

impl Default for OutputSection {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("out"),
            lock_files: false,
            max_concurrent_writes: 4,
            allow_custom_paths: false,
        }
    }
}

/// The EventHub's buffers (`hsx serve` also journals events to `{output.dir}/hsx-events.jsonl`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsSection {
    /// Events kept (in memory and in the disk journal) for subscribers resuming with `from_seq`.
    pub journal_capacity: usize,
    /// Live events buffered per subscriber; a subscriber that falls further behind is
    /// disconnected (it resumes with `from_seq`, losing nothing still journaled).
    pub subscriber_buffer: usize,
}

impl Default for EventsSection {
    fn default() -> Self {
        Self {
            journal_capacity: 65_536,
            subscriber_buffer: 1024,
        }
    }
}

/// The Unix socket of `hsx serve` (JSON lines).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SocketSection {
    pub path: PathBuf,
    /// File mode of the socket (write it in octal: `0o600`).
    pub mode: u32,
    /// Longest accepted request line in bytes; longer lines are answered with an error.
    pub max_line_bytes: usize,
    /// Connections served at once; one more is answered with a `too_many_connections` error
    /// line and closed.
    pub max_connections: usize,
    /// Kernel send buffer of each connection in bytes (0: the OS default). Together with
    /// `events.subscriber_buffer` it bounds how far a subscriber may lag before it is dropped.
    pub send_buffer_bytes: usize,
}

impl Default for SocketSection {
    fn default() -> Self {
        Self {
            path: PathBuf::from("hsx.sock"),
            mode: 0o600,
            max_line_bytes: 16 << 20,
            max_connections: 256,
            send_buffer_bytes: 0,
        }
    }
}

/// The HTTP listener of `hsx serve`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// `ADDR:PORT`, e.g. `127.0.0.1:8000` (port 0: any free port).
    pub address: String,
    /// Largest accepted request body in bytes (413 beyond it).
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
}

fn default_max_body() -> usize {
    32 << 20
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Serve Prometheus metrics at `/metrics` on the HTTP listener.
    pub enabled: bool,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self { enabled: true }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingSection {
    pub format: LogFormat,
    /// A tracing filter (`info`, `hsx=debug,warn`); the `RUST_LOG` variable overrides it.
    pub level: String,
}

impl Default for LoggingSection {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// Bounds on one render of the model's chat template (it runs at every `messages` request).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChatSection {
    /// Template instructions one render may execute (minijinja fuel).
    pub max_render_fuel: u64,
    /// Bytes of rendered text one render may produce.
    pub max_render_bytes: usize,
}

impl Default for ChatSection {
    fn default() -> Self {
        let d = RenderLimits::default();
        Self {
            max_render_fuel: d.max_fuel,
            max_render_bytes: d.max_bytes,
        }
    }
}

impl ChatSection {
    pub fn render_limits(&self) -> RenderLimits {
        RenderLimits {
            max_fuel: self.max_render_fuel,
            max_bytes: self.max_render_bytes,
        }
    }
}

/// Where the model runs (`model.device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    Cpu,
    /// A CUDA device ordinal (`cuda` = `cuda:0`).
    Cuda(usize),
    /// CUDA device 0 when the `cuda` feature is built and a device is usable, else the CPU.
    Auto,
}

impl DeviceChoice {
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let bad = || {
            ConfigError::Invalid(format!(
                "model.device {s:?}: expected \"cpu\", \"cuda\", \"cuda:N\" or \"auto\""
            ))
        };
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            "auto" => Ok(Self::Auto),
            _ => match s.strip_prefix("cuda:") {
                Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                    n.parse().map(Self::Cuda).map_err(|_| bad())
                }
                _ => Err(bad()),
            },
        }
    }
}

fn default_device() -> String {
    "cpu".into()
}

/// Command-line overrides of the common knobs, applied before validation.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub model: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub layers: Option<Vec<usize>>,
    pub max_num_batched_tokens: Option<usize>,
    pub dtype: Option<DtypeChoice>,
    pub socket: Option<PathBuf>,
    pub http: Option<String>,
}

impl Config {
    /// Reads, parses and validates a config file; relative paths become relative to its dir.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut cfg = Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        cfg.model.path = base.join(&cfg.model.path);
        cfg.output.dir = base.join(&cfg.output.dir);
        cfg.socket.path = base.join(&cfg.socket.path);
        cfg.apply(overrides);
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses TOML text without touching paths or validating.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.message().to_owned(),
        })
    }

    pub fn apply(&mut self, o: &Overrides) {
        if let Some(m) = &o.model {
            self.model.path = m.clone();
        }
        if let Some(d) = &o.output {
            self.output.dir = d.clone();
        }
        if let Some(l) = &o.layers {
            self.engine.layer_ids = Some(l.clone());
        }
        if let Some(n) = o.max_num_batched_tokens {
            self.engine.max_num_batched_tokens = n;
        }
        if let Some(d) = o.dtype {
            self.engine.dtype = d;
        }
        if let Some(p) = &o.socket {
            self.socket.path = p.clone();
        }
        if let Some(a) = &o.http {
            match &mut self.http {
                Some(h) => h.address = a.clone(),
                None => {
                    self.http = Some(HttpSection {
                        address: a.clone(),
                        max_body_bytes: default_max_body(),
                    })
                }
            }
        }
    }

    /// Checks what can be checked without the model (layer ids need L: [`resolve_layer_ids`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let e = &self.engine;
        let positive = [
            ("engine.max_num_batched_tokens", e.max_num_batched_tokens),
            ("engine.max_num_seqs", e.max_num_seqs),
            ("engine.max_waiting", e.max_waiting),
            ("engine.block_size", e.block_size),
            ("engine.num_blocks", e.num_blocks),
            ("engine.max_pending_bytes", e.max_pending_bytes),
            (
                "output.max_concurrent_writes",
                self.output.max_concurrent_writes,
            ),
            ("events.subscriber_buffer", self.events.subscriber_buffer),
            ("socket.max_line_bytes", self.socket.max_line_bytes),
            ("socket.max_connections", self.socket.max_connections),
            ("chat.max_render_bytes", self.chat.max_render_bytes),
        ];
        if self.chat.max_render_fuel == 0 {
            return Err(ConfigError::Invalid(
                "chat.max_render_fuel must be at least 1".into(),
            ));
        }
        for (name, v) in positive {
            if v == 0 {
                return Err(ConfigError::Invalid(format!("{name} must be at least 1")));
            }
        }
        DeviceChoice::parse(&self.model.device)?;
        if self.socket.mode > 0o777 {
            return Err(ConfigError::Invalid(format!(
                "socket.mode {:#o} is not a file mode (write it in octal, e.g. 0o600)",
                self.socket.mode
            )));
        }
        if let Some(h) = &self.http
            && h.address.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(ConfigError::Invalid(format!(
                "http.address {:?} is not ADDR:PORT (e.g. 127.0.0.1:8000)",
                h.address
            )));
        }
        if tracing_subscriber::EnvFilter::try_new(&self.logging.level).is_err() {
            return Err(ConfigError::Invalid(format!(
                "logging.level {:?} is not a valid filter (e.g. info, hsx=debug)",
                self.logging.level
            )));
        }
        Ok(())
    }
}

/// The capture layer ids for a model with `num_layers` decoder layers: the configured ids in
/// ascending order, or speculators' EAGLE-3 default `[2, L/2, L-3, L]` (deduplicated for tiny
/// models). Configured duplicates or ids above L are errors.
pub fn resolve_layer_ids(
    configured: Option<&[usize]>,
    num_layers: usize,
) -> Result<Vec<usize>, ConfigError> {
    let l = num_layers;
    let Some(ids) = configured else {
        let mut ids = vec![2.min(l), l / 2, l.saturating_sub(3), l];
        ids.sort_unstable();
        ids.dedup();
        return Ok(ids);
    };
    if ids.is_empty() {
        return Err(ConfigError::Invalid("layer_ids is empty".into()));
    }
    if let Some(bad) = ids.iter().find(|&&i| i > l) {
        return Err(ConfigError::Invalid(format!(
            "layer id {bad} is out of range: the model has {l} layers, ids go from 0 (embeddings) to {l} (last layer, before the final norm)"
        )));
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(ConfigError::Invalid(format!(
            "layer id {} is given twice",
            w[0]
        )));
    }
    Ok(sorted)
}

/// Parses `0,2,5` into layer ids.
pub fn parse_layer_list(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|p| {
            p.trim()
                .parse::<usize>()
                .map_err(|_| format!("invalid layer id {:?} in {s:?}", p.trim()))
        })
        .collect()
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

//! The `hsx` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use hsx::config::{Config, DtypeChoice, LogFormat, Overrides, parse_layer_list};
use hsx::engine::Engine;

#[derive(Parser)]
#[command(
    name = "hsx",
    version,
    about = "Save hidden states of chosen layers of a causal LM"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the embedded engine over a JSON-lines prompt file and write one file per request.
    Extract(ExtractArgs),
    /// Check hidden-state files or directories of them (exit code 1 if any file is bad).
    Inspect(InspectArgs),
    /// Run the daemon: Unix socket (JSON lines), HTTP (OpenAI subset) and /metrics.
    Serve(ServeArgs),
    /// Print the daemon's completion events as JSON lines.
    Subscribe(SubscribeArgs),
    /// Send a JSON-lines file of requests through the daemon's socket.
    Submit(SubmitArgs),
    /// Print what hsx sees: CPU features and threads, bf16 GEMM paths, CUDA device or why not.
    Env,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Unix socket path (overrides socket.path).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// HTTP address ADDR:PORT (overrides http.address; enables HTTP).
    #[arg(long)]
    http: Option<String>,
}

#[derive(Args)]
struct SubscribeArgs {
    /// The daemon's Unix socket.
    #[arg(long)]
    socket: PathBuf,
    /// First replay every journaled event numbered after N (0: all of them).
    #[arg(long)]
    from_seq: Option<u64>,
    /// Exit after printing this many events.
    #[arg(long)]
    count: Option<usize>,
}

#[derive(Args)]
struct SubmitArgs {
    /// The daemon's Unix socket.
    #[arg(long)]
    socket: PathBuf,
    /// JSON lines: {"id": "...", "token_ids": [...]} or {"text": "..."} per line.
    file: PathBuf,
    /// Also wait for every accepted request's completion event and print it.
    #[arg(long)]
    wait: bool,
}

#[derive(Args)]
struct InspectArgs {
    /// Files or directories.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Only the summary, not every file.
    #[arg(long)]
    summary: bool,
}

/// `--layers 0,2,5` (a newtype so clap takes one value, not a list of values).
#[derive(Clone)]
struct LayerList(Vec<usize>);

/// Flags that override config.toml.
#[derive(Args)]
struct CommonArgs {
    /// The config file.
    #[arg(long, default_value = "config.toml")]
    config: PathBuf,
    /// Hugging Face model directory (overrides model.path).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Output directory (overrides output.dir).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Layer ids to capture, e.g. 0,2,5 (overrides engine.layer_ids).
    #[arg(long, value_parser = |s: &str| parse_layer_list(s).map(LayerList))]
    layers: Option<LayerList>,
    /// Token budget per step (overrides engine.max_num_batched_tokens).
    #[arg(long)]
    max_num_batched_tokens: Option<usize>,
    /// dtype of the saved hidden states: auto, f32, bf16, f16 or fp8 (overrides engine.dtype).
    #[arg(long, value_parser = |s: &str| DtypeChoice::parse(s).map_err(|e| e.to_string()))]
    dtype: Option<DtypeChoice>,
}

#[derive(Args)]
struct ExtractArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// JSON lines ({"id": "...", "token_ids" | "text" | "messages": ...} per line), or a
    /// Hugging Face `datasets` directory saved with `save_to_disk` (column `input_ids`; row r
    /// becomes `hs_{r}.safetensors`).
    #[arg(long)]
    input: PathBuf,
    /// Only machine i of N: a contiguous slice of the rows, e.g. `--shard 0/4`.
    #[arg(long, value_parser = hsx::extract::Shard::parse)]
    shard: Option<hsx::extract::Shard>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

impl CommonArgs {
    fn load(&self) -> anyhow::Result<Config> {
        self.load_with(None, None)
    }

    fn load_with(&self, socket: Option<PathBuf>, http: Option<String>) -> anyhow::Result<Config> {
        let overrides = Overrides {
            socket,
            http,
            model: self.model.clone(),
            output: self.output.clone(),
            layers: self.layers.clone().map(|l| l.0),
            max_num_batched_tokens: self.max_num_batched_tokens,
            dtype: self.dtype,
        };
        Ok(Config::load(&self.config, &overrides)?)
    }
}

/// Logs to stderr; `RUST_LOG` overrides the level.
fn init_logging(level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        init_logging("warn", LogFormat::Text);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Extract(args) => extract(args).await,
        Command::Inspect(args) => inspect(args),
        Command::Env => {
            print!("{}", hsx::env_report::report());
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(args) => serve(args).await,
        Command::Subscribe(args) => {
            let mut out = std::io::stdout();
            hsx::server::client::subscribe(&args.socket, args.from_seq, args.count, &mut out)
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Submit(args) => {
            let mut out = std::io::stdout();
            let s = hsx::server::client::submit_file(&args.socket, &args.file, args.wait, &mut out)
                .await?;
            eprintln!(
                "hsx: accepted {}, rejected {}{}",
                s.accepted,
                s.rejected,
                if args.wait {
                    format!(", completed {}, failed {}", s.completed, s.failed)
                } else {
                    String::new()
                }
            );
            let ok = s.rejected == 0 && s.failed == 0;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let cfg = match args.common.load_with(args.socket, args.http) {
        Ok(cfg) => cfg,
        Err(e) => {
            init_logging("warn", LogFormat::Text);
            return Err(e);
        }
    };
    init_logging(&cfg.logging.level, cfg.logging.format);
    let listeners = hsx::server::Listeners::bind(&cfg).await?;
    let engine = match hsx::server::start_engine(&cfg).await {
        Ok(e) => e,
        Err(e) => {
            let _ = std::fs::remove_file(&listeners.unix_path);
            return Err(e);
        }
    };
    let info = engine.info();
    tracing::info!(
        model = %info.model_name,
        layers = ?info.layer_ids,
        dtype = info.dtype.name(),
        output = %info.output_dir.display(),
        "engine started"
    );
    let options = hsx::server::ServerOptions::from_config(&cfg);
    hsx::server::run(engine, listeners, options, hsx::server::signal()).await?;
    Ok(ExitCode::SUCCESS)
}

fn inspect(args: InspectArgs) -> anyhow::Result<ExitCode> {
    use hsx::inspect::{collect_files, format_file, format_summary, inspect_file};
    let files = collect_files(&args.paths).context("listing files")?;
    let reports: Vec<_> = files.iter().map(|f| inspect_file(f)).collect();
    if !args.summary {
        for r in &reports {
            print!("{}", format_file(r));
        }
    }
    if reports.len() != 1 || args.summary {
        print!("{}", format_summary(&reports));
    }
    let ok = !reports.is_empty() && reports.iter().all(|r| r.is_ok());
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn extract(args: ExtractArgs) -> anyhow::Result<ExitCode> {
    let cfg = args.common.load()?;
    let engine = Engine::start(&cfg).await.context("starting the engine")?;
    let info = engine.info().clone();
    eprintln!(
        "hsx: model {} ({} layers, hidden {}) on {}, capturing layers {:?} as {} into {}",
        info.model_name,
        info.num_layers,
        info.hidden_size,
        info.device,
        info.layer_ids,
        info.dtype.name(),
        info.output_dir.display()
    );
    let opts = hsx::extract::ExtractOptions {
        show_progress: !args.quiet,
        shard: args.shard,
        render_limits: cfg.chat.render_limits(),
    };
    let summary = hsx::extract::run_with(&engine, &args.input, &opts).await;
    engine.shutdown().await;
    let summary = summary?;
    eprint!("{}", summary.report());
    Ok(if summary.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
